"""kill -9 at random moments, then --resume: every prompt ends exactly once, nothing torn, statistics true."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, start_cli, write_dataset
from scripted_server import ScriptedServer

SEED = 20260115
KILLS = 10
UNIQUE = 300
DUPLICATED = 10  # prompts that occur twice: resume must count copies, not just texts
SESSION_DEADLINE = 90.0


def dataset() -> list[str]:
    prompts = [f"crash prompt {i}: " + "x" * (i % 50) for i in range(UNIQUE)]
    return prompts + prompts[:: UNIQUE // DUPLICATED][:DUPLICATED]


def script(prompts: list[str]) -> dict:
    """Every 7th prompt answers without reasoning, so discarded.jsonl takes part in the resume too."""
    return {
        p: [{"content": f"answer to {p}"}] if i % 7 == 3 else [{"content": f"answer to {p}", "reasoning": "hm"}]
        for i, p in enumerate(prompts[:UNIQUE])
    }


def lines_written(run_dir: Path) -> int:
    """Newlines in the files a finished prompt goes to."""
    total = 0
    for p in [*run_dir.glob("batch_*.jsonl"), run_dir / "discarded.jsonl"]:
        try:
            total += p.read_bytes().count(b"\n")
        except FileNotFoundError:
            pass
    return total


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate(timeout=30)


def run_until_killed(args: list[str], cwd: Path, run_dir: Path, rng: random.Random, quota: int) -> str:
    """Start a session and SIGKILL its whole process group at a random moment; returns what the moment was.

    The moment is a random time (often still at start-up) or a random number of new lines, never more than
    `quota` lines, so that every kill finds work left to interrupt.
    """
    before = lines_written(run_dir)
    by_time = rng.random() < 0.3
    target = rng.uniform(0.2, 6.0) if by_time else rng.randint(1, quota)
    proc = start_cli(args, cwd)
    start = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - start < SESSION_DEADLINE:
            written = lines_written(run_dir) - before
            if by_time and (time.monotonic() - start >= target or written >= quota):
                break
            if not by_time and written >= target:
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"session ended before its kill (exit {proc.returncode}):\n{err}")
        assert time.monotonic() - start < SESSION_DEADLINE, "session made no progress"
    finally:
        kill_group(proc)
    return f"{target:.2f} s" if by_time else f"{target} lines"


def tear_tail(path: Path, rng: random.Random) -> None:
    """Leave half a line at the end of a file, as a kill in the middle of a write would."""
    lines = path.read_bytes().splitlines(keepends=True)
    if lines:
        line = rng.choice(lines)
        with open(path, "ab") as f:
            f.write(line[: len(line) // 2])


def assert_consistent(run_dir: RunDir) -> None:
    """What a killed session leaves behind is readable: an intact checkpoint and no duplicate line."""
    cp = run_dir.path / "checkpoint.json"
    if cp.exists():
        json.loads(cp.read_text())
    records = run_dir.batch_records() + run_dir.discarded()
    raw = [json.dumps(r, sort_keys=True) for r in records]
    assert len(raw) == len(set(raw)), "a line was written twice"


@pytest.mark.slow
def test_sigkill_at_ten_random_moments_then_resume(tmp_path):
    rng = random.Random(SEED)
    prompts = dataset()
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    out = tmp_path / "data"
    run_dir = RunDir(out / "crash")
    args = [
        f"--dataset_file={data}",
        "--batch_size=25",
        "--run_name=crash",
        "--model=m",
        f"--output_dir={out}",
        "--api_key=crash-test-key",
        "--distribution=minimal",
        "--num_workers=2",
        "--concurrency=12",
        "--seed=1",
    ]
    moments = []
    torn_batches = 0
    with ScriptedServer(script=script(prompts), latency=0.15, jitter=0.9, seed=SEED) as srv:
        args.append(f"--base_url={srv.base_url}")
        for k in range(KILLS):
            frozen = run_dir.snapshot()
            quota = (len(prompts) - lines_written(run_dir.path)) // (KILLS - k + 1)
            session_args = args + (["--resume"] if k else [])
            moments.append(run_until_killed(session_args, tmp_path, run_dir.path, rng, quota))
            for name, content in frozen.items():
                assert (run_dir.path / name).read_bytes() == content, f"{name} of an earlier session was touched"
            assert_consistent(run_dir)
            if k in (3, 6):
                tear_tail(run_dir.path / f"batch_{max(run_dir.batch_numbers())}.jsonl", rng)
                torn_batches += 1
                if (run_dir.path / "discarded.jsonl").exists():
                    tear_tail(run_dir.path / "discarded.jsonl", rng)
        final = run_cli([*args, "--resume"], tmp_path)
    assert_clean_exit(final)

    trajectories, discarded = run_dir.trajectories(), run_dir.discarded()
    ended = Counter(prompt_of_record(r) for r in trajectories + discarded)
    assert ended == Counter(prompts), f"not exactly once after kills at {moments}"
    assert all(r["metadata"]["batch_num"] is not None for r in trajectories)
    assert not run_dir.failed()
    raw = (run_dir.path / "trajectories.jsonl").read_bytes().splitlines()
    assert len(raw) == len(set(raw)) == len(trajectories), "torn or duplicate line in trajectories.jsonl"

    stats = run_dir.stats()
    assert stats["prompts"] == {
        "total": len(prompts),
        "done": len(trajectories),
        "discarded": len(discarded),
        "failed": 0,
        "not_run": 0,
    }
    assert stats["merge"]["kept"] == len(trajectories)
    assert stats["merge"]["filtered_not_json"] == torn_batches
    assert len(discarded) == sum(1 for p in prompts if int(p.split()[2].rstrip(":")) % 7 == 3)
