"""The API key never leaks: not to sandboxed commands, not into data/<run_name>/, not to stdout or stderr."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cli_helpers import ROOT, assert_clean_exit, run_cli, write_dataset
from fake_site import FakeSite, json_reply
from scripted_server import ScriptedServer

from agentbatch import secrets_guard

# "BRSECRE[T]" matches the marker but not itself, so a grep in /proc does not find its own command line.
PATTERN = "BRSECRE[T]"
PROBES = [
    "env",
    "cat /proc/self/environ | tr '\\0' '\\n'",
    f"cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -a '{PATTERN}'; "
    f"cat /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -a '{PATTERN}'; echo scan-done",
    # Up the process tree to the runner, and read its own /proc files. The walk goes through /proc/self, not
    # $PPID: a command in a PID namespace has $PPID 0, but the host's /proc still shows its host ancestors.
    "ps auxww 2>/dev/null | grep -a -c 'batch_runne[r]'; R=$(awk '{print $4}' /proc/self/stat); "
    "while [ \"$R\" -gt 1 ] && ! tr '\\0' ' ' < /proc/$R/cmdline | grep -q 'batch_runne[r]'; "
    "do R=$(awk '{print $4}' /proc/$R/stat); done; "
    "echo runner-cmdline: $(tr '\\0' ' ' < /proc/$R/cmdline); "
    "tr '\\0' '\\n' < /proc/$R/environ | grep -a 'API_KE[Y]'",
]
READS = ["/proc/self/environ", "/proc/self/cmdline"]


def marker() -> str:
    return f"BRSECRET{uuid.uuid4().hex}"


def probing_script() -> list[dict]:
    """One probe per turn, then a final answer."""
    turns = [{"tool_calls": [{"name": "terminal", "arguments": {"command": c}}]} for c in PROBES]
    turns += [{"tool_calls": [{"name": "read_file", "arguments": {"path": p}}]} for p in READS]
    return [*turns, {"content": "all probed", "reasoning": "looked everywhere"}]


def tool_outputs(server: ScriptedServer) -> str:
    """Every tool result the model was sent: what the sandboxed commands saw."""
    return "\n".join(
        str(m.get("content"))
        for body in server.requests()
        for m in body.get("messages") or []
        if m.get("role") == "tool"
    )


def assert_nowhere(secret: str, run_dir: Path, proc, seen_by_model: str) -> None:
    hits = [str(p) for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not hits, f"secret written to {hits}"
    assert secret not in proc.stdout and secret not in proc.stderr
    assert secret not in seen_by_model, "a sandboxed command saw the secret"


def sandbox_kinds():
    docker = pytest.param("docker", marks=pytest.mark.docker)
    if importlib.util.find_spec("docker") is None:
        docker = pytest.param("docker", marks=pytest.mark.skip(reason="the docker SDK is not installed"))
    return ["local", docker]


@pytest.fixture
def sandbox_flags(request) -> list[str]:
    if request.param == "local":
        return ["--sandbox=local"]
    images = request.getfixturevalue("docker_images")  # skips when no engine answers
    return ["--sandbox=docker", f"--docker_image={images[0]}"]


def _run(tmp_path: Path, server: ScriptedServer, flags: list[str], env: dict | None = None, dist="terminal_only"):
    data = write_dataset(tmp_path / "ds.jsonl", ["probe one", "probe two"])
    args = [
        f"--dataset_file={data}",
        "--batch_size=1",
        "--run_name=secret",
        "--model=m",
        f"--output_dir={tmp_path / 'data'}",
        f"--base_url={server.base_url}",
        f"--distribution={dist}",
        "--require_reasoning=false",
        "--num_workers=1",
        "--concurrency=2",
        "--verbose=true",
        *flags,
    ]
    proc = run_cli(args, tmp_path, env=env)
    assert_clean_exit(proc)
    return proc, tmp_path / "data" / "secret"


@pytest.mark.parametrize("sandbox_flags", sandbox_kinds(), indirect=True)
def test_key_from_flag_leaks_nowhere(tmp_path, sandbox_flags):
    secret = marker()
    with ScriptedServer(default_script=probing_script()) as srv:
        proc, run_dir = _run(tmp_path, srv, [f"--api_key={secret}", *sandbox_flags])
        seen = tool_outputs(srv)
    assert "scan-done" in seen and "PATH=" in seen, "the probes did not run"
    assert_nowhere(secret, run_dir, proc, seen)
    if sandbox_flags == ["--sandbox=local"]:
        # The runner's command line was readable, and the key in it is masked.
        assert "batch_runner.py" in seen
        assert f"--api_key={'*' * len(secret)}" in seen


@pytest.mark.parametrize("sandbox_flags", sandbox_kinds(), indirect=True)
def test_key_from_environment_leaks_nowhere(tmp_path, sandbox_flags):
    secret = marker()
    with ScriptedServer(default_script=probing_script()) as srv:
        proc, run_dir = _run(tmp_path, srv, sandbox_flags, env={"OPENROUTER_API_KEY": secret})
        seen = tool_outputs(srv)
    assert "scan-done" in seen, "the probes did not run"
    assert_nowhere(secret, run_dir, proc, seen)
    if sandbox_flags == ["--sandbox=local"]:
        assert f"OPENROUTER_API_KEY={'*' * len(secret)}" in seen


def test_tool_credentials_in_environment_reach_no_process_and_still_work(tmp_path):
    """Search keys and other credentials: not in any process a local command can read, yet the tools get them."""
    secrets = {"TAVILY_API_KEY": marker(), "SOME_SERVICE_TOKEN": marker(), "DB_PASSWORD": marker()}
    script = [
        *probing_script()[:-1],
        {"tool_calls": [{"name": "web_search", "arguments": {"query": "where is the key"}}]},
        {"content": "all probed", "reasoning": "looked everywhere"},
    ]
    result = {"title": "a tavily result", "url": "https://example.com/", "content": "x"}
    tavily = FakeSite({"/search": lambda seen: json_reply({"results": [result]})})
    try:
        with ScriptedServer(default_script=script) as srv:
            env = dict(secrets, TAVILY_BASE_URL=tavily.url, WEB_SEARCH_BACKEND="tavily")
            proc, run_dir = _run(tmp_path, srv, ["--sandbox=local"], env=env, dist="terminal_web")
            seen = tool_outputs(srv)
    finally:
        tavily.close()
    assert "scan-done" in seen and "PATH=" in seen, "the probes did not run"
    for secret in secrets.values():
        assert_nowhere(secret, run_dir, proc, seen)
    # The runner's own initial environment still names the variables, masked.
    assert f"TAVILY_API_KEY={'*' * len(secrets['TAVILY_API_KEY'])}" in seen
    # The worker had the search key all the same: the search backend was called with it.
    keys = [request.headers.get("authorization") for request in tavily.seen]
    assert keys == [f"Bearer {secrets['TAVILY_API_KEY']}"] * 2, keys
    assert "a tavily result" in seen


def test_key_echoed_by_a_command_is_redacted_from_files(tmp_path):
    """Last line of defence: even a secret the model types itself is never written."""
    secret = marker()
    script = [
        {"tool_calls": [{"name": "terminal", "arguments": {"command": f"echo {secret}"}}]},
        {"content": f"the key is {secret}", "reasoning": f"I saw {secret}"},
    ]
    with ScriptedServer(default_script=script) as srv:
        proc, run_dir = _run(tmp_path, srv, [f"--api_key={secret}"])
    hits = [p.name for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not hits
    assert "[REDACTED]" in (run_dir / "trajectories.jsonl").read_text()
    assert secret not in proc.stdout + proc.stderr


CHILD = """
import os, sys, time
sys.path.insert(0, {root!r})
from agentbatch import secrets_guard
secret = os.environ["SECRET_FOR_TEST"]
before = open("/proc/self/cmdline", "rb").read()
n = secrets_guard.hide_from_proc([secret])
print(n, secret.encode() in before, sys.argv[-1] == "--key=" + secret, flush=True)
time.sleep(60)
"""


def test_hide_from_proc_masks_cmdline_and_environ_of_a_live_process():
    secret = marker()
    code = CHILD.format(root=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-c", code, f"--key={secret}"],
        env={"SECRET_FOR_TEST": secret, "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        hidden, was_visible, argv_intact = child.stdout.readline().split()
        cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{child.pid}/environ").read_bytes()
    finally:
        child.kill()
        child.wait()
    assert was_visible == "True" and argv_intact == "True"
    assert int(hidden) == 2
    assert secret.encode() not in cmdline and secret.encode() not in environ
    assert b"--key=" + b"*" * len(secret) in cmdline
    assert b"SECRET_FOR_TEST=" + b"*" * len(secret) in environ


def test_hide_from_proc_is_harmless_without_secrets():
    assert secrets_guard.hide_from_proc([]) == 0
    assert secrets_guard.hide_from_proc(["", "not-in-this-process-" + uuid.uuid4().hex]) == 0
    assert len(secrets_guard.memory_ranges()) == 2
    assert secrets_guard.memory_ranges(pid=2**31) == []
