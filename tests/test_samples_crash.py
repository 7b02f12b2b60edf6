"""kill -9 while checks run, then --resume: every (prompt, occurrence, sample) ends exactly once."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, start_cli, write_dataset
from scripted_server import ScriptedServer
from test_crash_resume import kill_group, lines_written
from verify_helpers import answer, args_for, sh

SEED = 15
KILLS = 4
PROMPTS = 36
SAMPLES = 3
DEADLINE = 90.0


def checks_running(log: Path) -> int:
    """Checks started and not yet ended, from the lines each check appends to a log outside its sandbox."""
    try:
        words = Counter(log.read_text().split())
    except FileNotFoundError:
        return 0
    return words["start"] - words["end"]


def kill_during_a_check(args: list[str], cwd: Path, run_dir: Path, log: Path, target: int) -> bool:
    """Start a session; SIGKILL its process group once `target` new lines exist and a check is running.

    Returns whether a check was running at the kill (a session that finishes first fails the test).
    """
    before = lines_written(run_dir)
    proc = start_cli(args, cwd)
    start = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - start < DEADLINE:
            if lines_written(run_dir) - before >= target and checks_running(log) > 0:
                return True
            time.sleep(0.005)
        out, err = proc.communicate() if proc.poll() is not None else ("", "")
        raise AssertionError(f"no moment to kill during a check (exit {proc.returncode}):\n{err}")
    finally:
        kill_group(proc)


@pytest.mark.slow
def test_sigkill_during_checks_then_resume_ends_every_sample_once(tmp_path):
    rng = random.Random(SEED)
    log = tmp_path / "checks.log"
    prompts = [f"task {i}" for i in range(PROMPTS)]
    dataset = prompts + prompts[:4]  # four prompts occur twice: each occurrence has its own samples
    rows = [
        {"prompt": p, "verify": f"echo start >> {log}; sleep 0.3; echo end >> {log}; test -f out.txt"} for p in dataset
    ]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    # Every third task is solved (its check passes); the others are not, and --require_pass discards them.
    script = {
        p: [sh("echo done > out.txt"), answer("solved")] if i % 3 == 0 else [answer("no")]
        for i, p in enumerate(prompts)
    }
    run = RunDir(tmp_path / "out" / "v")
    args = args_for(data, tmp_path / "out", "v", f"--samples_per_prompt={SAMPLES}", "--require_pass", "--concurrency=8")
    with ScriptedServer(script=script, latency=0.05, jitter=0.9, seed=SEED) as srv:
        args.append(f"--base_url={srv.base_url}")
        args.append("--api_key=crash-key")
        total = len(dataset) * SAMPLES
        for k in range(KILLS):
            target = rng.randint(1, (total - lines_written(run.path)) // (KILLS - k + 1))
            assert kill_during_a_check(args + (["--resume"] if k else []), tmp_path, run.path, log, target)
        final = run_cli([*args, "--resume"], tmp_path)
    assert_clean_exit(final)

    ended = Counter((prompt_of_record(r), r["sample_index"]) for r in run.trajectories() + run.discarded())
    occurrences = Counter(dataset)
    assert ended == Counter({(p, s): n for p, n in occurrences.items() for s in range(SAMPLES)})
    assert not run.failed()
    assert all(r["passed"] is True for r in run.trajectories())
    assert {r["discard_reason"] for r in run.discarded()} == {"check_failed"}
    solved = sum(n for p, n in occurrences.items() if int(p.split()[1]) % 3 == 0) * SAMPLES
    assert len(run.trajectories()) == solved
    stats = run.stats()
    assert stats["prompts"] == {"total": total, "done": solved, "discarded": total - solved, "failed": 0, "not_run": 0}
    o = stats["outcomes"]
    assert (o["checked"], o["passed"]) == (total, solved)
    assert o["pass_at_k_prompts"] == {str(k): PROMPTS + 4 for k in range(1, SAMPLES + 1)}
