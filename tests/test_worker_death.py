"""A worker process dying mid-run, in the real CLI: exactly its prompts fail, a fresh worker runs the rest."""

from __future__ import annotations

from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

SLOW = [thinking("held", latency=2.0)]
# The terminal's shell is a child of the worker running the prompt: this kills that worker outright.
KILLER = [{"tool_calls": [{"name": "terminal", "arguments": {"command": "kill -9 $PPID"}}], "latency": 0.3}]


def test_a_dead_worker_fails_exactly_its_prompts_and_a_new_one_runs_the_rest(tmp_path):
    held, later = ["held one", "held two"], ["later one", "later two", "later three"]
    write_dataset(tmp_path / "ds.jsonl", ["the killer", *held, *later])
    # Three sessions: one worker process (forked at start) holds the killer and both held prompts.
    args = ["--dataset_file=ds.jsonl", "--batch_size=10", "--run_name=dies", "--concurrency=3"]
    args += ["--distribution=terminal_only", "--require_reasoning=false", "--max_retries=0"]
    script = {"the killer": KILLER, **{p: SLOW for p in held}}
    with ScriptedServer(script=script, default_script=[thinking("fine")]) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, code=3)
    run = RunDir(tmp_path / "data" / "dies")
    failed = {f["prompt"]: f["error"] for f in run.failed()}
    assert set(failed) == {"the killer", *held}
    assert all(e.startswith("worker process died (exit code -9)") for e in failed.values()), failed
    # The worker that replaced it (spawned: the runner has threads by then) ran the rest.
    assert sorted(prompt_of_record(r) for r in run.trajectories()) == sorted(later)
    assert run.stats()["prompts"] == {"total": 6, "done": 3, "discarded": 0, "failed": 3, "not_run": 0}
