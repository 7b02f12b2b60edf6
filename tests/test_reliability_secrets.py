"""Reliability: the key reaches no place it must not (issue 18, item 6).

A local command cannot read it out of the runner's or a worker's memory; a tool result is redacted before
the endpoint sees it, before it is cut to length; an endpoint echoing the key in an error leaks it to no
log line (--verbose included) and no file, whole or as a prefix. All through the real CLI.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, cli_command, cli_env, run_cli, write_dataset
from scripted_server import ScriptedServer

PROBE = r"""
import os, sys
run, markers = sys.argv[1].encode(), [m.encode() for m in sys.argv[2:]]

def read(pid, name):
    try:
        return open(f"/proc/{pid}/{name}", "rb").read().replace(b"\0", b" ")
    except OSError:
        return b""

# The command runs in a PID namespace of its own, but /proc is the machine's: find this run's runner (its
# command line names the run's directory) and its worker (forked from it, named br-worker).
targets = {}
for entry in os.listdir("/proc"):
    if entry.isdigit() and run in read(entry, "cmdline") and b"batch_runner.py" in read(entry, "cmdline"):
        targets["worker" if read(entry, "comm").strip() == b"br-worker" else "runner"] = int(entry)

def scan(pid):
    try:
        regions = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb")
    except OSError as e:
        return f"denied ({e.strerror})"
    found = False
    with mem:
        for line in regions:
            span, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                block = mem.read(end - start)
            except (OSError, OverflowError, ValueError):
                continue
            found = found or any(m in block for m in markers)
    return "readable, key found" if found else "readable, key not found"

for name in ("runner", "worker"):
    print(f"{name}: {scan(targets[name]) if name in targets else 'not found'}")
"""


def marker(kind: str = "key") -> str:
    return f"sk-br-{kind}-{uuid.uuid4().hex}{uuid.uuid4().hex}"


def args_for(data, out, srv, *extra) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=10",
        "--run_name=secret",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--num_workers=1",
        "--verbose=true",
        "--sandbox=local",  # these cases are the local sandbox's: its commands run as the runner's user
        *extra,
    ]


def sent_tool_results(srv: ScriptedServer) -> str:
    """Every tool result the endpoint was sent."""
    return "\n".join(
        str(m.get("content")) for b in srv.requests() for m in b.get("messages") or [] if m.get("role") == "tool"
    )


def everything_written(run_dir: Path, proc) -> str:
    files = "\n".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())
    return f"{files}\n{proc.stdout}\n{proc.stderr}"


def without_ptrace_capability() -> list[str]:
    """A prefix for the runner's command line: as root it would have CAP_SYS_PTRACE, which reads any process.

    A user's run has no such capability; dropping it from the run's bounding set makes a root test machine
    the same, for the runner and every command it starts.
    """
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.fail("setpriv (util-linux) is needed to run this test as root")
    return [setpriv, "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", "--"]


def test_a_local_command_cannot_read_the_runner_or_worker_memory(tmp_path):
    key, search_key = marker(), marker("tavily")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    command = f"{sys.executable} {probe} {tmp_path / 'out'} {key} {search_key}"
    script = [{"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}, {"content": "probed"}]
    data = write_dataset(tmp_path / "ds.jsonl", ["read the runner's memory"])
    env = cli_env({"OPENROUTER_API_KEY": key, "TAVILY_API_KEY": search_key})
    with ScriptedServer(default_script=script) as srv:
        proc = subprocess.run(
            [*without_ptrace_capability(), *cli_command(args_for(data, tmp_path / "out", srv))],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        seen = sent_tool_results(srv)
    assert_clean_exit(proc)
    [result] = [json.loads(v) for v in seen.splitlines() if v.strip()]
    report = result["output"]
    assert "runner: denied" in report and "worker: denied" in report, report
    for secret in (key, search_key):
        assert secret not in seen and secret not in everything_written(tmp_path / "out" / "secret", proc)


def test_tool_results_are_redacted_before_the_endpoint_sees_them_and_before_any_cut(tmp_path):
    key = marker()
    # The model types the key: printed whole, printed cut to a prefix, and straddling the output cap's cut.
    padded = f"{sys.executable} -c \"print('a' * 13320 + '{key}' + 'b' * 20000)\""
    commands = [f"echo whole {key}", f"echo prefix {key[:24]}", padded]
    script = [{"tool_calls": [{"name": "terminal", "arguments": {"command": c}}]} for c in commands]
    data = write_dataset(tmp_path / "ds.jsonl", ["echo the key"])
    with ScriptedServer(default_script=[*script, {"content": "echoed"}]) as srv:
        proc = run_cli(args_for(data, tmp_path / "out", srv, f"--api_key={key}"), tmp_path)
        seen = sent_tool_results(srv)
    assert_clean_exit(proc)
    assert "whole [REDACTED]" in seen and "prefix [REDACTED]" in seen, seen[:500]
    assert "characters cut" in seen, "the third output was not cut"
    for text in (seen, everything_written(tmp_path / "out" / "secret", proc)):
        assert key[:16] not in text and key[-16:] not in text


def test_an_endpoint_echoing_the_key_in_an_error_leaks_it_to_no_log_and_no_file(tmp_path):
    key = marker()
    echo = f"invalid credentials in header Authorization: Bearer {key}"
    # The message is cut to 200 characters: here 20 characters into the key, a prefix a late redaction misses.
    padding = "x" * (200 - len(echo) + len(key) - 20)
    script = {
        "short echo": [{"fault": "401", "fault_times": -1, "error_message": echo}],
        "long echo": [{"fault": "401", "fault_times": -1, "error_message": padding + echo}],
    }
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with ScriptedServer(script=script) as srv:
        proc = run_cli(args_for(data, tmp_path / "out", srv, f"--api_key={key}"), tmp_path)
    assert_clean_exit(proc, 3)
    run = RunDir(tmp_path / "out" / "secret")
    assert {f["prompt"] for f in run.failed()} == set(script)
    assert all("HTTP 401" in f["error"] and "[REDACTED]" in f["error"] for f in run.failed()), run.failed()
    assert proc.stderr.count("HTTP 401") == 2, proc.stderr  # --verbose logged each failure with its reason
    written = everything_written(run.path, proc)
    assert key[:16] not in written, "the key, or a long prefix of it, was written or printed"
