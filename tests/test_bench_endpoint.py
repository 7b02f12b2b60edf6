"""bench/async_endpoint.py, the scale benchmarks' endpoint, answers a chat request as the scripted server does."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from scripted_server import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [
    {"reasoning": "look", "tool_calls": [{"name": "read_file", "arguments": {"path": "/etc/hostname"}}]},
    {"reasoning": "done", "content": "Done with: {prompt}"},
]


def post(base_url: str, body: dict) -> dict:
    request = urllib.request.Request(
        base_url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def comparable(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("id", "created")}


@contextlib.contextmanager
def bench_endpoint(tmp_path, *flags: str):
    """bench/async_endpoint.py on a free port with SCRIPT (and `flags`): its base URL."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    endpoint = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "async_endpoint.py"), "--default_script", str(script), *flags],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield endpoint.stdout.readline().split()[1]
    finally:
        endpoint.terminate()
        endpoint.wait(timeout=30)


def timings(base: str, route: str = "/_timings") -> dict:
    with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + route, timeout=30) as r:
        return json.loads(r.read())


def test_the_bench_endpoint_gives_the_scripted_servers_replies(tmp_path):
    with bench_endpoint(tmp_path) as base:
        first = {"model": "m", "messages": [{"role": "user", "content": "task 7"}], "tools": []}
        second = dict(first, messages=[*first["messages"], {"role": "assistant", "content": None}])
        with ScriptedServer(default_script=SCRIPT) as srv:
            for body in (first, second):
                assert comparable(post(base, body)) == comparable(post(srv.base_url, body))
        seen = timings(base)
        assert seen["requests"] == 2 and seen["first_request"] <= seen["last_reply"]


def test_the_bare_client_asks_every_call_of_every_prompt_in_turn(tmp_path):
    """bench/bare_client.py, (10)'s floor: each prompt's calls follow the script to its answer."""
    with bench_endpoint(tmp_path) as base:
        client = [sys.executable, str(ROOT / "bench" / "bare_client.py"), "--base_url", base]
        out = subprocess.run([*client, "--prompts=20", "--concurrency=8", "--calls=2"], capture_output=True, text=True)
        assert json.loads(out.stdout) == {"done": 20, "calls": 40, "answered": 20, "failed": 0, "errors": 0}, out.stderr
        assert timings(base)["requests"] == 40


@pytest.mark.parametrize("said", ["retry-after", "none"])
def test_the_bench_endpoint_refuses_beyond_its_window_limit(tmp_path, said):
    """(14)-(15)'s endpoint: R requests in a sliding second, then a 429 at once with Retry-After or nothing."""
    body = {"model": "m", "messages": [{"role": "user", "content": "task 1"}]}
    with bench_endpoint(tmp_path, "--rate_limit", "3", "--rate_window", "--rate_headers", said) as base:
        answers = []
        for _ in range(5):
            try:
                post(base, body)
                answers.append((200, {}))
            except urllib.error.HTTPError as e:
                answers.append((e.code, dict(e.headers)))
        seen = timings(base, "/_rate")
    assert [status for status, _ in answers] == [200, 200, 200, 429, 429]
    refusal = answers[3][1]
    assert ("Retry-After" in refusal) == (said == "retry-after") and "x-ratelimit-limit-requests" not in refusal
    assert seen["accepted"] == 3 and seen["refused"] == 2 and len(seen["accepted_at"]) == 3
