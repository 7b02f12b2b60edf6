"""A bwrap or local sandbox removed after its sample's outcome went back (sandboxes/closing.py), in real sandboxes.

The backend's clean-up returns at once and the removal follows on a closer thread: the sandbox's shell ends and
its directory goes, as before, and `drain` waits for it. Past PENDING removals waiting, the caller removes its
sandbox itself. A removal that fails is said and the next one still happens. Through the real CLI: every
worker removes its samples' sandboxes before it exits, so the end of the run finds no worker's leftovers to reap;
and a session's last reap, which a backend may make by label (docker's), comes after its workers have exited.
"""

from __future__ import annotations

import json
import logging
import os
import threading

import pytest
from cli_helpers import RunDir, run_cli, write_dataset
from sandbox_support import alive, create, sandbox_dirs_in, spec_for
from scripted_server import ScriptedServer

from agentbatch.sandboxes import closing, registry

RESIDENT = ("bwrap", "local-pidns")


def _made(kind: str):
    """A sandbox of this kind that ran a command (its shell is up), its directory on the host, its shell's PID."""
    spec = spec_for(kind)
    box = create(spec)
    assert box.exec("echo kept > kept.txt", 30).exit_code == 0
    path = box._base if kind == "bwrap" else box._tmp
    return registry.get(spec.kind), box, path, box._shell.current.pid


def _hold_closers() -> threading.Event:
    """Every closer thread of this process kept busy until the event is set (after the removals pending now)."""
    assert closing.drain(60)
    gate = threading.Event()
    for _ in range(closing.CLOSERS):
        closing.defer(lambda: gate.wait(60))
    return gate


@pytest.mark.parametrize("kind", RESIDENT)
def test_the_clean_up_returns_at_once_and_the_sandbox_goes_after(kind):
    backend, box, path, shell = _made(kind)
    gate = _hold_closers()
    try:
        backend.cleanup(box, False)
        assert os.path.exists(path)
        assert alive(shell), "the removal ran on the sample's thread"
    finally:
        gate.set()
    assert closing.drain(60)
    assert not os.path.exists(path) and not alive(shell)


@pytest.mark.parametrize("kind", RESIDENT)
def test_past_the_pending_bound_the_caller_removes_its_sandbox_itself(kind, monkeypatch):
    monkeypatch.setattr(closing, "PENDING", closing.CLOSERS)
    backend, box, path, shell = _made(kind)
    gate = _hold_closers()
    try:
        backend.cleanup(box, False)  # CLOSERS removals pending already: this one is the caller's
        assert not os.path.exists(path) and not alive(shell)
    finally:
        gate.set()
    assert closing.drain(60)


def test_a_removal_that_fails_is_said_and_the_next_one_still_happens(caplog):
    backend, box, path, shell = _made("local-pidns")

    def broken():
        raise RuntimeError("a backend's bug")

    with caplog.at_level(logging.WARNING, logger="agentbatch.sandboxes.closing"):
        for _ in range(closing.CLOSERS + 1):  # every closer thread meets one
            closing.defer(broken)
        backend.cleanup(box, False)
        assert closing.drain(60)
    assert "a sandbox's removal failed: RuntimeError: a backend's bug" in caplog.text
    assert not os.path.exists(path) and not alive(shell)


@pytest.mark.parametrize("sandbox", ["bwrap", "local"])
def test_each_worker_removes_its_samples_sandboxes_before_it_exits(tmp_path, sandbox, private_tmp):
    """Four samples on two workers, each leaving 20,000 files, so that their removals are still under way when the
    run has its last outcome: nothing is left, and nothing was left for the run's end to reap as a dead worker's."""
    spec_for("bwrap" if sandbox == "bwrap" else "local-pidns")  # skips (a failure in CI) where it cannot run
    command = "mkdir many && cd many && printf '%s\\n' {1..20000} | xargs touch && ls | wc -l"
    tool = {"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}
    prompts = [f"p{i}" for i in range(4)]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    args = [f"--dataset_file={data}", "--batch_size=20", "--run_name=closing", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=2"]
    args += ["--concurrency=4", f"--sandbox={sandbox}"]
    with ScriptedServer(script={p: [tool, {"content": "done"}] for p in prompts}) as srv:
        proc = run_cli(args, tmp_path, srv, env={"TMPDIR": str(private_tmp)})
    assert proc.returncode == 0, proc.stderr
    assert "whose worker had died" not in proc.stderr, proc.stderr
    assert sandbox_dirs_in(private_tmp) == []
    lines = RunDir(tmp_path / "out" / "closing").trajectories()
    outputs = [json.loads(t["value"])["output"] for r in lines for t in r["conversations"] if t["from"] == "tool"]
    assert outputs == ["20000\n"] * 4


def test_where_no_closer_thread_can_start_the_caller_removes_its_sandbox(monkeypatch):
    backend, box, path, shell = _made("local-pidns")
    monkeypatch.setattr(closing, "_closers", None)  # this process's closers not started yet

    def refused(self):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(closing.threading.Thread, "start", refused)
    backend.cleanup(box, False)
    assert not os.path.exists(path) and not alive(shell)
    assert closing.drain(0)  # nothing was left waiting


DEFERRING = "deferring_sandbox.py"  # tests/plugins: removals deferred and slow, reaped as by label
ROLLOUTS_CALLER = """
import json, sys
sys.path.insert(0, sys.argv[1])
from agentbatch import Rollouts

with Rollouts(**json.loads(sys.argv[2])) as rollouts:
    print(sum(len(g.samples) for g in rollouts.run([{"prompt": f"p{i}"} for i in range(4)])), flush=True)
"""


def _deferring(tmp_path):
    """The plug-in's marks directory, its file, and a server whose four prompts each run a command, then answer."""
    from cli_helpers import ROOT

    marks = tmp_path / "marks"
    marks.mkdir()
    tool = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo ran"}}]}
    server = ScriptedServer(script={f"p{i}": [tool, {"content": "done"}] for i in range(4)})
    return marks, ROOT / "tests" / "plugins" / DEFERRING, server


def _removed_once_each(marks) -> None:
    assert len((marks / "removed.log").read_text().split()) == 4
    assert sorted(os.listdir(marks)) == ["removed.log"]


def test_the_sessions_last_reap_waits_for_its_workers_deferred_removals(tmp_path):
    """A backend that defers its removals and reaps by label, as a plug-in may: the session's end reaps only once its
    workers have exited, so it finds nothing of theirs pending (and says no false "outlived their samples")."""
    marks, plugin, server = _deferring(tmp_path)
    data = write_dataset(tmp_path / "ds.jsonl", [f"p{i}" for i in range(4)])
    args = [f"--dataset_file={data}", "--batch_size=20", "--run_name=deferred", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=2"]
    args += ["--concurrency=4", f"--plugins={plugin}", "--sandbox=deferring"]
    with server as srv:
        proc = run_cli(args, tmp_path, srv, env={"BR_TEST_MARKS": str(marks)})
    assert proc.returncode == 0, proc.stderr
    assert "removed" not in proc.stderr, proc.stderr
    _removed_once_each(marks)


def test_the_rollouts_last_reap_waits_for_their_workers_deferred_removals(tmp_path):
    """The same through the Python API: leaving `with Rollouts(...)` ends the workers before the session's reap."""
    import subprocess
    import sys

    from cli_helpers import ROOT, RUN_TIMEOUT, cli_env

    marks, plugin, server = _deferring(tmp_path)
    caller = tmp_path / "caller.py"
    caller.write_text(ROLLOUTS_CALLER)
    with server as srv:
        values = {"model": "m", "base_url": srv.base_url, "api_key": "k", "plugins": str(plugin)}
        values |= {"sandbox": "deferring", "distribution": "terminal_only", "require_reasoning": False}
        values |= {"num_workers": 2, "concurrency": 4, "run_name": "api", "output_dir": str(tmp_path / "out")}
        done = subprocess.run(
            [sys.executable, str(caller), str(ROOT), json.dumps(values)],
            cwd=tmp_path,
            env=cli_env({"BR_TEST_MARKS": str(marks)}),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["4"]
    assert "removed" not in done.stderr, done.stderr
    _removed_once_each(marks)
