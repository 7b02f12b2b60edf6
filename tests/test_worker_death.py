"""A worker process dying mid-run, in the real CLI: exactly its prompts fail, a fresh worker runs the rest."""

from __future__ import annotations

import os
import signal
import time

import psutil
from cli_helpers import RunDir, prompt_of_record, start_cli, thinking, write_dataset
from scripted_server import ScriptedServer

SLOW = [thinking("held", latency=4.0)]


def test_a_dead_worker_fails_exactly_its_prompts_and_a_new_one_runs_the_rest(tmp_path):
    held, later = ["held one", "held two"], ["later one", "later two", "later three"]
    started = tmp_path / "killer-started"
    # The killer's command says it runs, then the test kills the worker that runs it (as the OOM killer
    # would): a command cannot do it itself, each runs in a PID namespace of its own.
    killer = [{"tool_calls": [{"name": "terminal", "arguments": {"command": f"touch {started}; sleep 60"}}]}]
    write_dataset(tmp_path / "ds.jsonl", ["the killer", *held, *later])
    # Three sessions: one worker process (forked at start) holds the killer and both held prompts.
    args = ["--dataset_file=ds.jsonl", "--batch_size=10", "--run_name=dies", "--concurrency=3", "--sandbox=local"]
    args += ["--distribution=terminal_only", "--require_reasoning=false", "--max_retries=0"]
    script = {"the killer": killer, **{p: SLOW for p in held}}
    with ScriptedServer(script=script, default_script=[thinking("fine")]) as srv:
        proc = start_cli(args, tmp_path, srv)
        try:
            deadline = time.monotonic() + 120
            while not started.exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
                time.sleep(0.05)
            [worker] = [p for p in psutil.Process(proc.pid).children() if p.name() == "br-worker"]
            os.kill(worker.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=180)
        finally:
            proc.kill()
    assert proc.returncode == 3, err
    run = RunDir(tmp_path / "data" / "dies")
    failed = {f["prompt"]: f["error"] for f in run.failed()}
    assert set(failed) == {"the killer", *held}
    assert all(e.startswith("worker process died (exit code -9)") for e in failed.values()), failed
    # The worker that replaced it (spawned: the runner has threads by then) ran the rest.
    assert sorted(prompt_of_record(r) for r in run.trajectories()) == sorted(later)
    assert run.stats()["prompts"] == {"total": 6, "done": 3, "discarded": 0, "failed": 3, "not_run": 0}
