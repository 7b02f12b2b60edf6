"""A sample's sandbox started beside its first model call (sandboxes/early.py), in the real bwrap and local sandboxes.

`warm` starts the resident shell without waiting for it, and the first command then runs in that very shell;
a warmed shell nobody used leaves nothing behind; one that cannot start says why at the first command, and the
next starts another. Through the real CLI: while the model thinks over a sample's first call, its sandbox is
already up (and its command then runs in it), and a worker whose samples only answer stops starting them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time

import psutil
import pytest
from cli_helpers import RunDir, assert_clean_exit, start_cli, write_dataset
from sandbox_support import alive, create, spec_for
from scripted_server import ScriptedServer

from agentbatch.sandboxes import early, registry, starts
from agentbatch.sandboxes.base import SandboxError, SandboxSettings, SandboxSpec
from agentbatch.sandboxes.early import EarlyStarts
from agentbatch.sandboxes.local import LocalSandbox
from agentbatch.sandboxes.sample import SampleSandbox

RESIDENT = ("bwrap", "local-pidns")
# The process that holds a sample's resident shell, by sandbox: bwrap, or unshare for the local PID namespace.
HOLDER = {"bwrap": "bwrap", "local": "unshare"}


@pytest.mark.parametrize("kind", RESIDENT)
def test_warm_starts_the_shell_that_the_first_command_then_runs_in(kind):
    spec = spec_for(kind)
    backend = registry.get(spec.kind)
    sandbox = create(spec)
    try:
        assert backend.warms and backend.warm(sandbox)
        shell = sandbox._shell.current
        assert shell is not None and alive(shell.pid)  # up before any command
        assert backend.ran_commands(sandbox) is False
        done = sandbox.exec("echo $$", timeout=30)
        assert (done.exit_code, done.output) == (0, "1\n")  # PID 1 of its namespace: the resident shell
        assert sandbox._shell.current is shell  # the warmed one, not another
        assert backend.ran_commands(sandbox) is True
        assert not backend.warm(sandbox)  # one shell a sandbox
    finally:
        sandbox.cleanup()


@pytest.mark.parametrize("kind", RESIDENT)
def test_a_warmed_shell_never_used_leaves_nothing(kind):
    spec = spec_for(kind)
    sandbox = create(spec)
    registry.get(spec.kind).warm(sandbox)
    pid = sandbox._shell.current.pid
    sandbox.cleanup()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(pid)


def test_a_warmed_shell_that_cannot_start_says_why_at_the_first_command_and_the_next_starts_another():
    spec_for("local-pidns")  # skips (a failure in CI) where no PID namespace can be made
    where = tempfile.mkdtemp()
    sandbox = LocalSandbox(where, "pidns")
    try:
        os.rmdir(where)  # its working directory is gone: the shell's process cannot start
        assert sandbox.warm()  # which the warm does not wait to see
        with pytest.raises(SandboxError, match="the sandbox did not start: cannot start its shell"):
            sandbox.exec("echo hi", timeout=30)
        os.mkdir(where)
        done = sandbox.exec("echo hi", timeout=30)
        assert (done.exit_code, done.output) == (0, "hi\n")
    finally:
        sandbox.cleanup()
        shutil.rmtree(where, ignore_errors=True)


def test_a_worker_starts_early_while_most_of_its_samples_ran_commands():
    choice = EarlyStarts(window=4, unproven=2)
    assert [choice.want() for _ in range(3)] == [True, True, False]  # before any sample ended: at most 2
    choice.learn(True)
    assert choice.want()
    choice.learn(False)
    choice.learn(False)
    assert not choice.want()  # 1 of 3
    choice.learn(True)
    assert choice.want()  # 2 of 4: half is enough
    for _ in range(4):
        choice.learn(False)
    assert not choice.want()  # the window holds the last 4 only


def _holders(pid: int, name: str) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if p.name() == name]
    except psutil.NoSuchProcess:
        return []


def _requests_seen(srv: ScriptedServer, n: int, proc, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while len(srv.requests()) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the server saw {len(srv.requests())} requests, not {n}"
        time.sleep(0.02)


def _start(tmp_path, srv, kind: str, prompts: list[str], name: str):
    data = write_dataset(tmp_path / f"{name}.jsonl", prompts)
    args = [f"--dataset_file={data}", "--batch_size=10", f"--run_name={name}", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    args += ["--concurrency=1", f"--sandbox={kind}"]  # local: pidns, the best method where the test can run
    return start_cli(args, tmp_path, srv)


def _ended(proc) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("kind", RESIDENT)
def test_while_the_model_thinks_over_the_first_call_the_sandbox_is_already_up(tmp_path, kind):
    """The first reply takes 3 s: 1.5 s into it the sample's shell runs, and its command then runs in that one."""
    spec_for(kind)  # skips (a failure in CI) where it cannot run
    kind = kind.split("-")[0]
    first = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo $$; pwd"}}], "latency": 3.0}
    with ScriptedServer(script={"look": [first, {"content": "done"}]}) as srv:
        proc = _start(tmp_path, srv, kind, ["look"], "early")
        _requests_seen(srv, 1, proc)
        time.sleep(1.5)
        holders = _holders(proc.pid, HOLDER[kind])
        assert len(holders) == 1, "no sandbox was up while the model thought over the sample's first call"
        early_pid = holders[0].pid
        seen = []
        while proc.poll() is None:  # no other shell starts after the reply: the command runs in this one
            seen += [p.pid for p in _holders(proc.pid, HOLDER[kind])]
            time.sleep(0.02)
        assert_clean_exit(_ended(proc))
    assert set(seen) <= {early_pid}
    (record,) = RunDir(tmp_path / "out" / "early").trajectories()
    (result,) = [json.loads(t["value"]) for t in record["conversations"] if t["from"] == "tool"]
    assert result["exit_code"] == 0 and result["output"].splitlines()[0] == "1", result


def test_a_worker_whose_samples_only_answer_stops_starting_their_sandboxes(tmp_path):
    """One sample at a time, each answering after 1.5 s with the terminal offered: the first starts its sandbox
    early (nothing is known yet), the next ones do not."""
    spec_for("bwrap")
    answer = {"content": "nothing to run", "latency": 1.5}
    with ScriptedServer(script={p: [answer] for p in ("a", "b", "c")}) as srv:
        proc = _start(tmp_path, srv, "bwrap", ["a", "b", "c"], "answers")
        _requests_seen(srv, 1, proc)
        time.sleep(0.75)
        assert len(_holders(proc.pid, "bwrap")) == 1  # the first: started early, in case
        for n in (2, 3):
            _requests_seen(srv, n, proc)
            time.sleep(0.75)
            assert _holders(proc.pid, "bwrap") == [], f"sample {n} started a sandbox its worker's samples do not use"
        assert_clean_exit(_ended(proc))
    assert RunDir(tmp_path / "out" / "answers").stats()["samples"]["done"] == 3


@pytest.mark.parametrize("kind", RESIDENT)
def test_a_directory_sandbox_is_made_without_a_start_permit_a_container_waits_for_one(kind, monkeypatch):
    """--sandbox_starts paces docker's creations only: while every permit is held, a bwrap or local sample's sandbox
    is made at once, at its first use and beside its first model call, and a docker sample's waits (here past its
    time limit, so no engine is needed)."""
    spec = spec_for(kind, starts=1)
    docker = SandboxSpec(SandboxSettings(kind="docker", starts=1), image="any:1")
    monkeypatch.setattr(early, "policy", EarlyStarts())  # unlearned: it starts early
    permits = starts._semaphore(1)
    assert permits.acquire(timeout=5)  # the one permit, held by another sample's start
    try:
        first_use, beside = SampleSandbox(spec), SampleSandbox(spec)
        try:
            began = time.monotonic()
            assert first_use.get(time_left=5).exec("echo made", 30).output == "made\n"
            beside.start_early(time_left=5)
            assert beside.made and time.monotonic() - began < 4
        finally:
            first_use.close()
            beside.close()
        with pytest.raises(TimeoutError):
            SampleSandbox(docker).get(time_left=0.3)
    finally:
        permits.release()
