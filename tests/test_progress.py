"""The live view: plain periodic lines in a log, one redrawn line on a terminal, and an ETA from finished prompts."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess

import pytest
from cli_helpers import assert_clean_exit, cli_command, cli_env, run_cli, write_dataset
from scripted_server import ScriptedServer

from agentbatch.progress import Progress, eta, plain_line

ARGS = ["--batch_size=10", "--distribution=terminal_only", "--require_reasoning=false", "--num_workers=2"]
REPLY = [{"content": "answer", "latency": 0.3}]


def test_without_a_terminal_progress_is_plain_periodic_lines(tmp_path):
    write_dataset(tmp_path / "ds.jsonl", [f"p{i}" for i in range(24)])
    args = ["--dataset_file=ds.jsonl", "--run_name=plain", *ARGS, "--concurrency=4", "--progress_seconds=0.5"]
    args += ["--price_input=2", "--price_output=10"]
    with ScriptedServer(default_script=REPLY) as srv:
        proc = run_cli(args, tmp_path, srv)  # stderr is a pipe, as in CI
    assert_clean_exit(proc)
    assert "\r" not in proc.stderr and "\x1b" not in proc.stderr, "terminal control codes in a log"
    lines = [line for line in proc.stderr.splitlines() if line.startswith("progress [")]
    assert len(lines) >= 2, proc.stderr  # 24 prompts of 0.3 s at 4 in flight: about two seconds
    for line in lines:
        assert re.fullmatch(
            r"progress \[\d+(m\d\ds)?s?\]: \d+/24 \| done \d+ \| failed 0 \| discarded 0 \| in flight \d+ \| "
            r"\S+ tok/s \| \$\d+\.\d\d this session(, ~\$\d+\.\d\d projected)? \| ETA (\?|\S+)",
            line,
        ), line
    assert lines[-1].startswith("progress [") and "24/24 | done 24" in lines[-1] and "in flight 0" in lines[-1]


def test_on_a_terminal_one_line_is_redrawn_within_its_width(tmp_path):
    write_dataset(tmp_path / "ds.jsonl", [f"p{i}" for i in range(12)])
    args = ["--dataset_file=ds.jsonl", "--run_name=tty", *ARGS, "--concurrency=4"]
    main, child = pty.openpty()
    with ScriptedServer(default_script=[{"content": "answer", "latency": 0.5}]) as srv:
        proc = subprocess.Popen(
            cli_command(args, srv),
            cwd=tmp_path,
            env=cli_env({"COLUMNS": "70", "LINES": "20"}),
            stdout=subprocess.PIPE,
            stderr=child,
            text=True,
        )
        os.close(child)
        chunks = []
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:  # the child side closed: the run is over
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=120)
    os.close(main)
    assert proc.returncode == 0
    err = b"".join(chunks).decode()
    redraws = [part.split("\x1b[K")[0] for part in err.split("\r") if "done " in part]
    assert len(redraws) >= 2, err
    assert all(len(r) <= 69 for r in redraws), "a line wider than the terminal wraps and cannot be redrawn"
    assert "12/12" in redraws[-1] and "ETA" in redraws[-1]  # narrow: fields of least use are left out first
    assert err.endswith("\x1b[K\r\n")  # the last line is ended, so the summary starts on its own


def test_the_eta_comes_from_finished_prompts_not_from_batches():
    # 100 prompts of ~10 s on 10 slots: 10 done, 10 running for 4 s each, 80 to start: 6 s + 80 × 10 s / 10.
    assert eta(10.0, [4.0] * 10, 80, 10) == pytest.approx((10 * 6 + 80 * 10) / 10)
    # At the end only the running ones remain: the longest remainder, not a share of the slots.
    assert eta(10.0, [1.0, 9.0], 0, 10) == pytest.approx(9.0)
    assert eta(10.0, [], 0, 4) == 0


def test_prompts_running_past_the_mean_never_show_an_eta_of_0s():
    """Issue 26 item 6: `8/12 ... ETA 0s` for five minutes while prompts ran far past the mean."""
    assert eta(10.0, [12.0, 300.0], 0, 4) is None  # only overdue prompts left: no estimate
    assert eta(10.0, [12.0, 9.5], 0, 4) == pytest.approx(0.5)  # one still expected: its remainder
    assert eta(10.0, [300.0], 3, 4) == pytest.approx(7.5)  # the prompts not started still have the mean
    view = Progress(total=3, stream=io.StringIO(), interval=60, slots=4, terminal=False)
    for key in range(3):
        view.started(key)
    view.finished(0, "done", 0.0, {})
    snap = view.snapshot()
    assert snap.eta is None and snap.overdue is not None
    assert plain_line(snap).endswith(f"ETA ? (running {snap.overdue:.0f}s)")


def test_the_log_says_how_long_a_straggler_has_run_instead_of_eta_0s(tmp_path):
    write_dataset(tmp_path / "ds.jsonl", ["fast 1", "fast 2", "fast 3", "slow"])
    args = ["--dataset_file=ds.jsonl", "--run_name=late", *ARGS, "--concurrency=4", "--progress_seconds=0.5"]
    script = {"slow": [{"content": "answer", "latency": 4.0}]}
    with ScriptedServer(script=script, default_script=[{"content": "answer", "latency": 0.2}]) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("progress [")]
    running = [line for line in lines if "in flight 0" not in line]
    assert not [line for line in running if "ETA 0s" in line], proc.stderr
    assert any(re.search(r"ETA \? \(running \d+s\)$", line) for line in running), proc.stderr
    assert lines[-1].endswith("ETA 0s")  # all done


def test_the_view_reports_spend_and_the_budget_projection():
    view = Progress(total=10, stream=io.StringIO(), interval=60, slots=2, priced=True, terminal=False)
    view.started(0)
    view.started(1)
    view.finished(0, "done", 2.0, {"total_tokens": 100, "cost": 0.5})
    snap = view.snapshot()
    assert (snap.done, snap.in_flight, snap.spent) == (1, 1, 0.5)
    assert snap.projected == pytest.approx(0.5 + 0.5 * 9)
    assert snap.eta is not None and snap.eta >= 2.0 * 8 / 2
