"""bench/async_endpoint.py, the scale benchmarks' endpoint, answers a chat request as the scripted server does."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

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


def test_the_bench_endpoint_gives_the_scripted_servers_replies(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    endpoint = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "async_endpoint.py"), "--default_script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base = endpoint.stdout.readline().split()[1]
        first = {"model": "m", "messages": [{"role": "user", "content": "task 7"}], "tools": []}
        second = dict(first, messages=[*first["messages"], {"role": "assistant", "content": None}])
        with ScriptedServer(default_script=SCRIPT) as srv:
            for body in (first, second):
                assert comparable(post(base, body)) == comparable(post(srv.base_url, body))
        with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/_timings", timeout=30) as r:
            timings = json.loads(r.read())
        assert timings["requests"] == 2 and timings["first_request"] <= timings["last_reply"]
    finally:
        endpoint.terminate()
        endpoint.wait(timeout=30)


def test_the_bare_client_asks_every_call_of_every_prompt_in_turn(tmp_path):
    """bench/bare_client.py, (10)'s floor: each prompt's calls follow the script to its answer."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    endpoint = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "async_endpoint.py"), "--default_script", str(script)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        base = endpoint.stdout.readline().split()[1]
        client = [sys.executable, str(ROOT / "bench" / "bare_client.py"), "--base_url", base]
        out = subprocess.run([*client, "--prompts=20", "--concurrency=8", "--calls=2"], capture_output=True, text=True)
        assert json.loads(out.stdout) == {"done": 20, "calls": 40, "answered": 20, "failed": 0, "errors": 0}, out.stderr
        with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/_timings", timeout=30) as r:
            assert json.loads(r.read())["requests"] == 40
    finally:
        endpoint.terminate()
        endpoint.wait(timeout=30)
