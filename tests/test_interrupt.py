"""Ctrl-C: the first stops handing out prompts and finishes cleanly (exit 130), a second quits at once; --resume completes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from cli_helpers import (
    RunDir,
    assert_clean_exit,
    cli_command,
    cli_env,
    first_turn_prompts,
    prompt_of_record,
    run_cli,
    start_cli,
    write_dataset,
)
from scripted_server import ScriptedServer

PROMPTS = [f"interruptible prompt {i}" for i in range(40)]
CONCURRENCY = 6


def args_for(data: Path, out: Path, srv: ScriptedServer, *extra: str) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=5",
        "--run_name=ctrlc",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=interrupt-test-key",
        "--distribution=minimal",
        "--num_workers=2",
        f"--concurrency={CONCURRENCY}",
        *extra,
    ]


def wait_for_lines(run: RunDir, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Block until n samples are written, so the signal lands mid-run with samples in flight."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early (exit {proc.returncode}): {proc.communicate()[1]}")
        if len(run.batch_records()) >= n:
            return
        time.sleep(0.02)
    raise AssertionError("no progress")


def interrupt(proc: subprocess.Popen, whole_group: bool) -> None:
    """Ctrl-C as a terminal sends it (to the process group), or to the runner alone."""
    if whole_group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)


def assert_group_gone(pgid: int, timeout: float = 10) -> None:
    """No worker is left running a prompt in the background (killed ones may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes of the run are still alive {timeout} s after it exited")


def finish_with_resume(tmp_path: Path, data: Path, srv: ScriptedServer, run: RunDir) -> None:
    resumed = run_cli(args_for(data, tmp_path / "data", srv, "--resume"), tmp_path)
    assert_clean_exit(resumed, 0)
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(PROMPTS)
    stats = run.stats()
    assert stats["prompts"]["done"] == len(PROMPTS) and stats["prompts"]["not_run"] == 0
    assert run.json("checkpoint.json")["state"] == "finished"


@pytest.mark.slow
@pytest.mark.parametrize("whole_group", [False, True], ids=["runner-only", "process-group"])
def test_first_ctrl_c_finishes_running_prompts_then_resume_completes(tmp_path, whole_group):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "data" / "ctrlc")
    default = [{"content": "answer", "reasoning": "thought"}]
    with ScriptedServer(default_script=default, latency=1.0) as srv:
        proc = start_cli(args_for(data, tmp_path / "data", srv), tmp_path)
        try:
            wait_for_lines(run, CONCURRENCY, proc)
            interrupt(proc, whole_group)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        started = first_turn_prompts(srv)

        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert "no new samples" in err and "--resume" in err
        # Every prompt that had started was let finish; none started after the signal.
        ended = Counter(prompt_of_record(r) for r in run.batch_records())
        assert ended == started, "a running prompt was lost, or a new one was started after Ctrl-C"
        assert not run.failed()
        assert len(started) < len(PROMPTS)
        assert run.json("checkpoint.json")["state"] == "interrupted"
        stats = run.stats()
        assert stats["prompts"]["done"] == len(ended)
        assert stats["prompts"]["not_run"] == len(PROMPTS) - len(ended)
        assert "Run ctrlc" in out  # the summary is still printed

        srv.latency = 0.05
        finish_with_resume(tmp_path, data, srv, run)


@pytest.mark.slow
@pytest.mark.parametrize("whole_group", [False, True], ids=["runner-only", "process-group"])
def test_second_ctrl_c_quits_at_once_then_resume_completes(tmp_path, whole_group):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "data" / "ctrlc")
    # The first CONCURRENCY prompts are quick; the rest take long, so a prompt is mid-call at the signals.
    script = {
        p: [{"content": "a", "reasoning": "r", "latency": 0.2 if i < CONCURRENCY else 20}]
        for i, p in enumerate(PROMPTS)
    }
    with ScriptedServer(script=script) as srv:
        proc = start_cli(args_for(data, tmp_path / "data", srv), tmp_path)
        try:
            wait_for_lines(run, CONCURRENCY, proc)
            time.sleep(0.5)  # the slow prompts are now in flight
            interrupt(proc, whole_group)
            time.sleep(0.5)
            assert proc.poll() is None, "the first Ctrl-C must wait for running prompts"
            sent = time.monotonic()
            interrupt(proc, whole_group)
            out, err = proc.communicate(timeout=30)
            quit_after = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert quit_after < 10, f"second Ctrl-C took {quit_after:.1f} s"
        assert run.json("checkpoint.json")["state"] == "interrupted"
        assert len(run.batch_records()) == CONCURRENCY
        assert_group_gone(proc.pid)

        srv.script = {p: [{"content": "a", "reasoning": "r", "latency": 0.2}] for p in PROMPTS}
        finish_with_resume(tmp_path, data, srv, run)


@pytest.mark.slow
def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it(tmp_path):
    """A script's background job (`agentbatch … &`) is started with SIGINT ignored: Ctrl-C at the script's terminal,
    which reaches the job's process group too, must not stop it, as it does not while plug-ins load or in `serve`."""
    prompts = PROMPTS[:12]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    run = RunDir(tmp_path / "data" / "ctrlc")
    default = [{"content": "answer", "reasoning": "thought", "latency": 0.3}]
    with ScriptedServer(default_script=default) as srv:
        command = ["env", "--ignore-signal=INT", *cli_command(args_for(data, tmp_path / "data", srv))]
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for_lines(run, 2, proc)
            interrupt(proc, whole_group=True)
            time.sleep(0.2)
            interrupt(proc, whole_group=True)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert "Ctrl-C" not in err and "Traceback" not in err
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    assert run.json("checkpoint.json")["state"] == "finished"
