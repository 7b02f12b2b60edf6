"""Nothing a command starts outlives it: real processes in the real bwrap and local sandboxes.

Every way a process tries to get away (background, nohup, setsid, a double fork, a respawning loop, a
cleared or changed environment) is gone within 1 s of its command's end and of its prompt's end, also
50 times in a row on a loaded machine; a timeout kills the whole tree the same way; a fork bomb and a
memory bomb end their own command only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from helpers import run_agent_once, tool_turns
from sandbox_support import (
    CONTAINED,
    KINDS,
    cpu_load,
    create,
    escapes,
    new_marker,
    pids_with,
    spec_for,
    wait_gone,
)
from scripted_server import ScriptedServer

from agentbatch.sandboxes import registry

P = "the prompt"


def terminal_call(command: str) -> dict:
    return {"name": "terminal", "arguments": {"command": command}}


@pytest.mark.parametrize("kind", CONTAINED)
def test_every_escape_is_gone_when_its_command_ends(kind):
    sandbox = create(spec_for(kind))
    marker = new_marker()
    try:
        start = time.monotonic()
        result = sandbox.exec(escapes(marker), timeout=30)
        assert result.output == "started\n" and result.exit_code == 0, result
        assert time.monotonic() - start < 10, "the command waited for its background processes"
        assert wait_gone(marker, 1.0) == [], f"{kind}: processes outlived their command"
        # The sandbox is still usable, and nothing of the last command is in it.
        assert sandbox.exec(f"ps -eo args | grep -c '{marker[:6]}[.]'", timeout=30).output.strip() == "0"
    finally:
        sandbox.cleanup()


def test_the_scan_fallback_still_ends_what_keeps_its_tag():
    sandbox = create(spec_for("local-scan"))
    marker = new_marker()
    try:
        sandbox.exec(f"sleep {marker}1 > /dev/null 2>&1 & setsid sleep {marker}3 > /dev/null 2>&1 &", timeout=30)
        assert wait_gone(marker, 1.0) == []
    finally:
        sandbox.cleanup()


@pytest.mark.parametrize("kind", CONTAINED)
def test_a_timeout_kills_the_whole_tree(kind):
    sandbox = create(spec_for(kind))
    marker = new_marker()
    try:
        start = time.monotonic()
        result = sandbox.exec(f"{escapes(marker)}\nsleep {marker}0", timeout=1.5)
        assert result.timed_out and result.exit_code == -9 and "started" in result.output
        assert time.monotonic() - start < 6
        assert wait_gone(marker, 1.0) == []
    finally:
        sandbox.cleanup()


@pytest.mark.parametrize("kind", CONTAINED)
def test_nothing_outlives_a_prompt_through_the_real_runner(kind, tmp_path):
    marker = new_marker()
    script = [{"tool_calls": [terminal_call(escapes(marker))]}, {"content": "started a server"}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal"], sandbox=spec_for(kind).settings)
    assert json.loads(tool_turns(record)[0]["value"])["output"] == "started\n"
    assert wait_gone(marker, 1.0) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", CONTAINED)
def test_fifty_prompts_in_a_row_under_load_leave_not_one_survivor(kind):
    spec = spec_for(kind)
    survivors = {}
    with cpu_load():
        for run in range(50):
            marker = new_marker()
            sandbox = create(spec)
            try:
                sandbox.exec(escapes(marker), timeout=30)
                sandbox.exec(f"sleep {marker}0 > /dev/null 2>&1 & exit 3", timeout=30)
            finally:
                sandbox.cleanup()
            left = wait_gone(marker, 1.0)
            if left:
                survivors[run] = left
    assert survivors == {}, f"{kind}: processes outlived their prompt in runs {sorted(survivors)}"


@pytest.mark.parametrize("kind", ["bwrap"])
def test_a_fork_bomb_ends_its_own_command_only(kind):
    bombed = create(spec_for(kind, processes=64))
    other = create(spec_for(kind, processes=64))
    try:
        start = time.monotonic()
        result = bombed.exec("b() { b | b & }; b; sleep 3; echo after", timeout=8)
        assert time.monotonic() - start < 15
        # Beside it another prompt's command still forks freely.
        assert other.exec("for i in $(seq 30); do true & done; wait; echo fine", timeout=30).output == "fine\n"
        assert "Resource temporarily unavailable" in result.output or result.timed_out
        assert bombed.exec("echo usable", timeout=30).output == "usable\n"
    finally:
        bombed.cleanup()
        other.cleanup()


@pytest.mark.parametrize("kind", ["bwrap"])
def test_a_memory_bomb_ends_its_own_command_only(kind):
    sandbox = create(spec_for(kind, memory_bytes=256 * 1024**2))
    try:
        grab = "python3 -c 'x = bytearray(2 * 1024**3); print(len(x))'; echo exit=$?"
        result = sandbox.exec(grab, timeout=30)
        assert "MemoryError" in result.output and "exit=1" in result.output, result.output
        result = sandbox.exec("python3 -c 'b = [bytes(2**20) for _ in range(4096)]'; echo exit=$?", timeout=30)
        assert "MemoryError" in result.output, result.output
        assert sandbox.exec("python3 -c 'print(len(bytearray(100 * 2**20)))'", timeout=30).output == "104857600\n"
    finally:
        sandbox.cleanup()


LIMITS = "grep -E '^Max (cpu time|file size|data size|processes) ' /proc/self/limits"


def test_every_way_into_a_bwrap_sandbox_has_its_limits():
    """The resident shell's commands, a command apart, a long-lived process: the limits asked for, soft and hard."""
    sandbox = create(spec_for("bwrap", processes=77, memory_bytes=300 * 1024**2, file_size_bytes=5 * 1024**2))
    try:
        want = {
            "cpu time": ["600", "600"],
            "file size": [str(5 * 1024**2)] * 2,
            "data size": [str(300 * 1024**2)] * 2,
            "processes": ["77", "77"],
        }

        def parsed(text: str) -> dict:
            rows = [line[4:].split() for line in text.splitlines()]
            return {" ".join(row[:-3]): row[-3:-1] for row in rows}

        assert parsed(sandbox.exec(LIMITS, timeout=30).output) == want
        assert parsed(sandbox._exec_apart(LIMITS, timeout=30).output) == want
        process = sandbox.start(["/bin/sh", "-c", LIMITS])
        assert parsed(process.stdout.read().decode()) == want
        process.kill()
    finally:
        sandbox.cleanup()


def test_a_limit_the_sandbox_cannot_set_ends_its_start_with_why():
    """Above the runner's own hard limit (which its sandbox user may not raise) the sandbox does not start, and
    says which limit: in a process whose hard CPU limit is 100 s, a sandbox that asks for 600."""
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (100, 100))\n"
        "from agentbatch.sandboxes import bwrap\n"
        "from agentbatch.sandboxes.base import SandboxSettings\n"
        "print(bwrap.probe(SandboxSettings(kind='bwrap', cpu_seconds=600)))\n"
        "print(bwrap.probe(SandboxSettings(kind='bwrap', cpu_seconds=600, network=True)) is None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    refused, _ = done.stdout.splitlines()
    want = "the sandbox did not start: cannot set the sandbox's limit --sandbox_cpu_seconds=600: it is above"
    assert refused.startswith(want), done
    # The same process starts a sandbox that asks for no more than its hard limit.
    done = subprocess.run(
        [sys.executable, "-c", code.replace("600", "90")], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.splitlines() == ["None", "True"], done


@pytest.mark.parametrize("kind", KINDS)
def test_output_is_streamed_in_bounded_memory(kind):
    """200 MB of output: the head and the tail come back, the cut is marked, the worker holds a few MiB."""
    import resource

    sandbox = create(spec_for(kind))
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        result = sandbox.exec("echo FIRST; head -c 200000000 /dev/zero | tr '\\0' x; echo; echo LAST", timeout=60)
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        assert result.exit_code == 0
        assert result.output.startswith("FIRST\n") and result.output.endswith("LAST\n")
        assert "bytes cut" in result.output and len(result.output) < 7 * 2**20
        assert grown_mib < 50, f"reading the output grew this process by {grown_mib:.0f} MiB"
        # A command that prints without end until its timeout costs no more.
        result = sandbox.exec("yes", timeout=2)
        assert result.timed_out and len(result.output) < 7 * 2**20
        assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 50
    finally:
        sandbox.cleanup()


def test_sandboxes_of_a_dead_owner_are_reaped_and_live_ones_kept(tmp_path):
    """The parent removes what a dead worker left (directories, cgroups, tagged processes), never a live one's."""
    import subprocess
    import sys

    from agentbatch.sandboxes import local, sandbox_dirs

    marker = new_marker()
    # A worker stand-in: makes a scan-contained sandbox (whose processes only a reap can end), starts a
    # process in it that keeps its tag, and dies without cleaning up.
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1])\n"
        "from agentbatch.sandboxes.local import LocalSandbox\n"
        "s = LocalSandbox(containment_method='scan')\n"
        "s._made()\n"
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], env=s._env, start_new_session=True)\n"
        "print(s._tmp, flush=True)\n"
        "time.sleep(60)\n"
    )
    from cli_helpers import ROOT

    worker = subprocess.Popen([sys.executable, "-c", code, str(ROOT)], stdout=subprocess.PIPE, text=True)
    leftover = worker.stdout.readline().strip()
    live = local.LocalSandbox()
    live.exec("true", timeout=30)  # a sandbox in use: its directory exists
    try:
        assert pids_with(marker) and sandbox_dirs.owner_alive(leftover.rsplit("/", 1)[1])
        assert leftover not in sandbox_dirs.dead_leftovers()  # its owner still runs
        worker.kill()
        worker.wait()
        assert registry.get("local").reap({}) >= 1
        assert wait_gone(marker, 1.0) == []
        import os

        assert not os.path.exists(leftover) and os.path.isdir(live.workdir)
    finally:
        live.cleanup()
        worker.kill()
