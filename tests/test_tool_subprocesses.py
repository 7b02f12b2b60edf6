"""What a user's tool starts with `subprocess` and leaves running ends with its worker, through the real CLI.

A tool's `subprocess.Popen` forks without the at-fork hook that ends an `os.fork` child with its worker
(process_guard), so such a process, and what it started, outlived the run. Now the worker ends every process
below it at its end, and the runner, when it kills a worker (two Ctrl-C with samples in flight), ends the
worker's whole tree first. On Ray, each actor does it before Ray kills it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from cli_helpers import assert_clean_exit, run_cli, running_as, start_cli, thinking, write_dataset
from scripted_server import ScriptedServer

POPENS = '''
"""A tool that starts a process with a child of its own and leaves both running; a tool that takes its time."""

import subprocess
import time

from agentbatch import ToolContext, tool


@tool
def start_server(ctx: ToolContext, pid_file: str) -> dict:
    """Start a long-lived process that starts another."""
    p = subprocess.Popen(["sh", "-c", f"sleep 3601 & echo $! > {pid_file}.child; exec sleep 3600"])
    with open(pid_file, "w") as f:
        f.write(str(p.pid))
    return {"output": "started"}


@tool
def take_time(ctx: ToolContext) -> dict:
    """Sleep a minute."""
    time.sleep(60)
    return {"output": "slept"}
'''


def calls(name: str, **arguments) -> dict:
    return {"reasoning": "calling", "tool_calls": [{"name": name, "arguments": arguments}]}


def args_for(tmp_path, *flags) -> list[str]:
    module = tmp_path / "mine.py"
    module.write_text(POPENS)
    return [
        f"--dataset_file={write_dataset(tmp_path / 'data.jsonl', ['p'])}",
        "--batch_size=5",
        "--run_name=r",
        "--sandbox=local",
        f"--tools={module}",
        "--distribution=minimal",
        "--num_workers=1",
        *flags,
    ]


def running(pid: int) -> bool:
    """Whether `pid` is still a live `sleep` (not gone, not a zombie, not a pid used again)."""
    return running_as(pid, "sleep")


def pids(pid_file) -> list[int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            found = [int(pid_file.read_text()), int(pid_file.with_name(pid_file.name + ".child").read_text())]
            return found
        except (FileNotFoundError, ValueError):
            time.sleep(0.05)
    raise AssertionError("the tool's process never wrote its pids")


def assert_ended(started: list[int]) -> None:
    deadline = time.monotonic() + 5
    while any(running(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in started if running(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, "a process a tool started outlived its worker and the run"


def test_a_tools_subprocess_and_its_child_end_with_the_run(tmp_path):
    pid_file = tmp_path / "server.pid"
    with ScriptedServer(script={"p": [calls("start_server", pid_file=str(pid_file)), thinking("done")]}) as server:
        proc = run_cli(args_for(tmp_path), tmp_path, server, timeout=120)
    assert_clean_exit(proc)
    assert_ended(pids(pid_file))


def test_a_tools_subprocess_ends_when_the_run_is_quit_with_samples_in_flight(tmp_path):
    pid_file = tmp_path / "server.pid"
    script = {"p": [calls("start_server", pid_file=str(pid_file)), calls("take_time"), thinking("never")]}
    with ScriptedServer(script=script) as server:
        proc = start_cli(args_for(tmp_path), tmp_path, server)
        try:
            started = pids(pid_file)
            time.sleep(0.5)  # the sample is in take_time now
            os.kill(proc.pid, signal.SIGINT)  # the runner only: its workers ignore Ctrl-C, as in a terminal
            time.sleep(0.5)
            os.kill(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, proc.stderr.read()
    assert_ended(started)


def test_on_ray_a_tools_subprocess_ends_with_the_run(tmp_path):
    """On Ray each actor ends what its tools left running before Ray kills it (Ray's own end of a worker's
    children reached the tool's process but not its child: under the full suite's load that one ran on)."""
    pytest.importorskip("ray")
    pid_file = tmp_path / "server.pid"
    with ScriptedServer(script={"p": [calls("start_server", pid_file=str(pid_file)), thinking("done")]}) as server:
        proc = run_cli(args_for(tmp_path, "--ray_address=local"), tmp_path, server, timeout=300)
    assert_clean_exit(proc)
    assert_ended(pids(pid_file))
