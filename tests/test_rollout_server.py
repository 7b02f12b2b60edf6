"""`batch_runner.py serve` as a trainer in another process meets it: the real CLI in a subprocess, a real HTTP
client, the scripted endpoint behind it; the token, bad requests, a stream of groups, a client that leaves."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import time

import pytest
from cli_helpers import cli_command, cli_env, thinking
from scripted_server import ScriptedServer

TOKEN = "s3cret-token-for-tests"


@contextlib.contextmanager
def serving(srv, tmp_path, *flags: str, token: str | None = TOKEN):
    env = cli_env({"TMPDIR": str(tmp_path)})
    env.pop("BATCH_RUNNER_TOKEN", None)
    if token is not None:
        env["BATCH_RUNNER_TOKEN"] = token
    args = ["serve", "--port=0", "--model=m", "--sandbox=local", "--distribution=terminal_only", *flags]
    proc = subprocess.Popen(
        cli_command(args, srv), cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        line = proc.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert found, line + proc.stderr.read()
        yield int(found.group(1)), proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise


def request(port: int, method: str, path: str, body=None, token: str | None = TOKEN):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=headers)
    return conn, conn.getresponse()


def sandboxes(tmp_path) -> list[str]:
    return [n for n in os.listdir(tmp_path) if n.startswith("br-sandbox-")]


def test_groups_stream_one_line_each_as_they_finish_then_the_last_line(tmp_path):
    script = {"slow": [thinking("s", latency=3.0)], "fast": [thinking("f")]}
    with ScriptedServer(script=script) as srv, serving(srv, tmp_path, "--concurrency=4") as (port, _):
        tasks = [{"prompt": "slow"}, {"prompt": "fast"}]
        conn, resp = request(
            port, "POST", "/v1/rollouts", {"tasks": tasks, "samples_per_prompt": 2, "policy_version": "v7"}
        )
        assert resp.status == 200 and resp.getheader("Content-Type") == "application/x-ndjson"
        first = json.loads(resp.readline())
        rest = [json.loads(line) for line in resp.read().splitlines()]
        conn.close()
    assert (first["index"], first["task"]) == (1, {"prompt": "fast"})
    # The slow task is listed first: streamed at the batch's end (or in task order), it would come first.
    assert rest[0]["index"] == 0 and rest[-1] == {"done": True, "groups": 2, "failed": 0}
    samples = first["samples"] + rest[0]["samples"]
    assert [s["sample"] for s in first["samples"]] == [0, 1]
    assert {s["record"]["policy_version"] for s in samples} == {"v7"}
    assert all(s["status"] == "done" and s["tokens"] is None and s["reward"] is None for s in samples)
    assert TOKEN not in json.dumps(samples)


def test_every_request_needs_the_token_and_bad_requests_get_one_line(tmp_path):
    with ScriptedServer(default_script=[thinking("a")]) as srv, serving(srv, tmp_path) as (port, _):
        for token in (None, "wrong"):
            for method, path in (("GET", "/health"), ("POST", "/v1/rollouts")):
                _, resp = request(port, method, path, {"tasks": []}, token=token)
                assert resp.status == 401, (method, path, token)
                assert "unauthorized" in json.loads(resp.read())["error"]
        _, resp = request(port, "GET", "/health")
        assert (resp.status, json.loads(resp.read())) == (200, {"status": "ok"})
        bad = {
            b"{not json": "not JSON",
            json.dumps({"tasks": "x"}).encode(): '"tasks" must be a list',
            json.dumps({"tasks": [{"q": 1}]}).encode(): 'task 0: no "prompt" field',
            json.dumps({"tasks": [], "samples_per_prompt": 0}).encode(): "samples_per_prompt",
            json.dumps({"tasks": [], "base_url": "ftp://x"}).encode(): "base_url",
            json.dumps({"tasks": [], "colour": 1}).encode(): "unknown field 'colour'",
        }
        for body, says in bad.items():
            _, resp = request(port, "POST", "/v1/rollouts", body)
            text = resp.read().decode()
            assert resp.status == 400 and text.count("\n") == 1, (body, text)
            error = json.loads(text)["error"]
            assert says in error and "\n" not in error, (body, error)
        assert srv.requests() == []


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_without_a_token_it_does_not_start_on_loopback_or_beyond_in_one_line(tmp_path, host):
    done = subprocess.run(
        cli_command(["serve", f"--host={host}", "--port=0", "--model=m", "--sandbox=local"]),
        cwd=tmp_path,
        env={k: v for k, v in cli_env().items() if k != "BATCH_RUNNER_TOKEN"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "BATCH_RUNNER_TOKEN" in done.stderr and "Traceback" not in done.stderr
    assert "serving" not in done.stderr


def test_a_client_that_disconnects_cancels_its_rollouts_and_frees_their_sandboxes(tmp_path):
    """Each slow sample runs a command (its sandbox made), then waits on a slow reply that asks for another; the
    client leaves after the first group: no sample starts after that, and those in flight run no further tool."""
    tool = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo hi"}}], "reasoning": "r"}
    slow = [tool, dict(tool, latency=3.0), thinking("done")]
    with (
        ScriptedServer(script={"fast": [thinking("f")]}, default_script=slow) as srv,
        serving(srv, tmp_path, "--concurrency=3") as (port, _),
    ):
        tasks = [{"prompt": "fast"}] + [{"prompt": f"slow {i}"} for i in range(8)]
        conn, resp = request(port, "POST", "/v1/rollouts", {"tasks": tasks})
        first = json.loads(resp.readline())
        assert first["index"] == 0
        time.sleep(0.5)  # the slow samples have run their first command and wait for their second reply
        assert sandboxes(tmp_path)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.monotonic() + 30
        while sandboxes(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sandboxes(tmp_path) == []
        time.sleep(1.0)
        by_prompt: dict[str, int] = {}
        for r in srv.requests():
            by_prompt[r["messages"][0]["content"]] = by_prompt.get(r["messages"][0]["content"], 0) + 1
        # Slots for 3 samples: at most 2 slow ones started, each stopped after its slow reply (no third call).
        slow_started = [p for p in by_prompt if p.startswith("slow")]
        assert 1 <= len(slow_started) <= 3 and all(by_prompt[p] <= 2 for p in slow_started)
        _, resp = request(port, "GET", "/health")  # the server goes on serving
        assert resp.status == 200


@pytest.mark.parametrize("token", [TOKEN])
def test_the_token_never_reaches_the_endpoint_or_the_records(tmp_path, token):
    with ScriptedServer(default_script=[thinking("a")]) as srv, serving(srv, tmp_path, token=token) as (port, _):
        _, resp = request(port, "POST", "/v1/rollouts", {"tasks": [{"prompt": "p"}]})
        body = resp.read().decode()
    assert token not in json.dumps(srv.requests()) and token not in body


def test_requests_at_once_share_the_workers_each_with_its_own_settings(tmp_path):
    import threading

    with (
        ScriptedServer(default_script=[thinking("a", latency=0.3)]) as srv,
        serving(srv, tmp_path, "--concurrency=4") as (port, _),
    ):
        got: dict[str, list] = {}

        def ask(version: str) -> None:
            tasks = [{"prompt": f"{version} {i}"} for i in range(3)]
            body = {"tasks": tasks, "samples_per_prompt": 2, "policy_version": version, "model": f"model-{version}"}
            conn, resp = request(port, "POST", "/v1/rollouts", body)
            got[version] = [json.loads(line) for line in resp.read().splitlines()]
            conn.close()

        threads = [threading.Thread(target=ask, args=(v,)) for v in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        asked = {(r["model"], r["messages"][0]["content"].split()[0]) for r in srv.requests()}
    for version, lines in got.items():
        assert lines[-1] == {"done": True, "groups": 3, "failed": 0}
        records = [s["record"] for g in lines[:-1] for s in g["samples"]]
        assert sorted(g["index"] for g in lines[:-1]) == [0, 1, 2]
        assert {r["policy_version"] for r in records} == {version}
        assert {r["metadata"]["model"] for r in records} == {f"model-{version}"}
    assert asked == {("model-a", "a"), ("model-b", "b")}  # each request's samples called its own model


def test_serve_names_a_flag_it_does_not_know_in_one_line(tmp_path):
    done = subprocess.run(
        cli_command(["serve", "--port=0", "--colour=blue"]), cwd=tmp_path, env=cli_env(), capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--colour=blue" in done.stderr
    usage = subprocess.run(
        cli_command(["serve", "--help"]), cwd=tmp_path, env=cli_env(), capture_output=True, text=True
    )
    assert usage.returncode == 0 and "POST /v1/rollouts" in usage.stdout
