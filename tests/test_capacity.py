"""Where sessions run: the layout --num_workers and --concurrency get, and the OS limits they need."""

from __future__ import annotations

import resource
import subprocess
import threading
import time

import psutil
import pytest
from cli_helpers import RunDir, assert_clean_exit, cli_command, cli_env, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from agentbatch.errors import FatalError
from agentbatch.executors import capacity


@pytest.mark.parametrize(
    "sessions, cores, files, expected",
    [
        (4, 8, 20000, (1, 4)),  # a few sessions: one process, however many cores
        (32, 2, 20000, (1, 32)),
        (256, 2, 20000, (2, 128)),
        (1024, 2, 20000, (2, 512)),  # never more processes than cores
        (300, 2, 256, (13, 24)),  # a low open-file limit: more processes, each within it
    ],
)
def test_sessions_are_threads_in_at_most_one_process_per_core(sessions, cores, files, expected):
    plan = capacity.plan(sessions, cores=cores, open_files=files)
    assert (plan.processes, plan.threads) == expected and plan.slots == sessions
    assert plan.threads * capacity.FILES_PER_SLOT + capacity.FILES_PER_PROCESS <= files


def test_a_limit_no_layout_can_fit_is_a_clear_error():
    with pytest.raises(FatalError, match=r"open files.*ulimit -Hn.*--concurrency"):
        capacity.plan(50_000, cores=2, open_files=100)


def hard_file_limit(n: int):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, 64), n))


def worker_count(proc: subprocess.Popen, stop: threading.Event, seen: list[int]) -> None:
    """The most worker processes the run had at once, sampled until stop."""
    while not stop.is_set():
        try:
            seen.append(sum(1 for c in psutil.Process(proc.pid).children() if c.name() == "br-worker"))
        except psutil.Error:
            pass
        time.sleep(0.05)


@pytest.mark.slow
def test_sessions_beyond_a_low_open_file_limit_are_spread_over_processes_and_none_fails(tmp_path):
    """300 sessions under a hard limit of 256 open files: one process would run out of sockets."""
    n = 300
    prompts = [f"limited prompt {i}" for i in range(n)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    args = ["--dataset_file=ds.jsonl", "--batch_size=100", "--run_name=limits", "--num_workers=1"]
    args += ["--concurrency=300", "--require_reasoning=false", "--max_retries=0"]
    with ScriptedServer(default_script=[thinking("ok", latency=1.0)]) as srv:
        proc = subprocess.Popen(
            cli_command(args, srv),
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=hard_file_limit(256),  # the soft limit starts lower still: the runner raises it
        )
        stop, seen = threading.Event(), []
        sampler = threading.Thread(target=worker_count, args=(proc, stop, seen))
        sampler.start()
        out, err = proc.communicate(timeout=180)
        stop.set()
        sampler.join()
    assert proc.returncode == 0, err
    stats = RunDir(tmp_path / "data" / "limits").stats()
    assert stats["prompts"]["done"] == n and stats["prompts"]["failed"] == 0
    assert max(seen) == capacity.plan(300, open_files=256).processes == 13


@pytest.mark.parametrize(
    "concurrency, limit, words",
    [
        # Within 256 processes of 20,000 open files each (FILES_PER_SLOT), beyond the kernel's threads-max.
        (500_000, 20_000, ["500000 samples in flight need about", "threads", "--concurrency"]),
        (50_000, 100, ["50000 samples in flight need about", "open files", "ulimit -Hn"]),
    ],
)
def test_more_sessions_than_the_machine_can_give_stop_before_anything_starts(tmp_path, concurrency, limit, words):
    write_dataset(tmp_path / "ds.jsonl", ["never asked"])
    args = ["--dataset_file=ds.jsonl", "--batch_size=1", "--run_name=huge", f"--concurrency={concurrency}"]
    with ScriptedServer(default_script=[thinking("no")]) as srv:
        proc = subprocess.run(
            cli_command(args, srv),
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=hard_file_limit(limit) if limit else None,
        )
        asked = srv.requests()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in proc.stderr
    assert all(w in lines[0] for w in words), lines[0]
    assert not asked and not (tmp_path / "data").exists()


def test_num_workers_alone_runs_that_many_prompts_at_once(tmp_path):
    """--num_workers=6 without --concurrency: six samples in flight, no more."""
    n, latency = 12, 1.5
    write_dataset(tmp_path / "ds.jsonl", [f"parallel {i}" for i in range(n)])
    args = ["--dataset_file=ds.jsonl", "--batch_size=100", "--run_name=six", "--num_workers=6"]
    args += ["--require_reasoning=false"]
    with ScriptedServer(default_script=[thinking("ok", latency=latency)]) as srv:
        started = time.monotonic()
        proc = run_cli(args, tmp_path, srv)
        wall = time.monotonic() - started
        bodies = srv.requests()
    assert_clean_exit(proc)
    assert len(bodies) == n
    # Two rounds of six: no faster than 3 s (so never more than six at once), far from 18 s one at a time.
    assert n * latency / 6 <= wall < n * latency * 2 / 3, wall
