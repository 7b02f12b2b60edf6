"""Reliability: one session per run directory, nothing of a run outlives it, and errors say what broke.

Issue 18, items 4 (the run directory's lock), 5 (workers, the resource tracker and browsers die with a
runner killed with kill -9: no paid call after it) and 13 (a broken worker pipe is not a full disk), each
through the real CLI against a scripted endpoint on 127.0.0.1.
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from cli_helpers import (
    RunDir,
    assert_clean_exit,
    cli_command,
    cli_env,
    prompt_of_record,
    run_cli,
    start_cli,
    write_dataset,
)
from fake_site import FakeSite, html_reply
from scripted_server import ScriptedServer
from test_crash_resume import kill_group

from agentbatch.tools import browser_session
from agentbatch.tools.settings import ToolSettings

PROMPTS = [f"session prompt {i}" for i in range(6)]
ANSWER = {"content": "done", "reasoning": "hm"}


def args_for(data, out, srv, *extra, run_name="locked") -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=2",
        f"--run_name={run_name}",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=session-test-key",
        "--distribution=minimal",
        "--num_workers=1",
        *extra,
    ]


def wait_until(condition, proc: subprocess.Popen | None = None, seconds: float = 90, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended first (exit {proc.returncode}): {proc.communicate()[1]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_session_is_refused_while_one_runs_in_the_directory(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "out" / "locked")
    # One prompt at a time, 3 s a call: the first session is alive for 18 s.
    with ScriptedServer(default_script=[ANSWER], latency=3) as srv:
        first = start_cli(args_for(data, tmp_path / "out", srv), tmp_path)
        try:
            wait_until(lambda: srv.requests(), first, what="the first session's first call")
            resumed = run_cli(args_for(data, tmp_path / "out", srv, "--resume"), tmp_path)
            fresh = run_cli(args_for(data, tmp_path / "out", srv), tmp_path)
            assert first.poll() is None, "the first session ended before the others were tried"
            out, err = first.communicate(timeout=120)
        finally:
            if first.poll() is None:
                kill_group(first)
    assert first.returncode == 0, err
    for refused in (resumed, fresh):
        assert refused.returncode == 2, refused.stderr
        [line] = [x for x in refused.stderr.splitlines() if x.strip()]
        assert line.startswith("error: ") and "is in use by another session" in line, line
        assert f"pid {first.pid}" in line and "--resume" in line, line
        assert "Traceback" not in refused.stderr
    # Only the first session wrote: each prompt exactly once.
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(PROMPTS)
    assert len(run.batch_records()) == len(PROMPTS)


def test_two_fresh_starts_at_once_give_one_run(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "out" / "locked")
    with ScriptedServer(default_script=[ANSWER], latency=0.3) as srv:
        both = [start_cli(args_for(data, tmp_path / "out", srv), tmp_path) for _ in range(2)]
        try:
            results = [p.communicate(timeout=120) for p in both]
        finally:
            for p in both:
                if p.poll() is None:
                    kill_group(p)
    codes = sorted(p.returncode for p in both)
    assert codes == [0, 2], results
    refused = next(err for p, (_, err) in zip(both, results, strict=True) if p.returncode == 2)
    assert "is in use by another session" in refused or "already holds a run" in refused, refused
    assert Counter(prompt_of_record(r) for r in run.batch_records()) == Counter(PROMPTS)


def test_the_lock_of_a_session_killed_with_kill_9_never_blocks_a_resume(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "out" / "locked")
    with ScriptedServer(default_script=[ANSWER], latency=0.5) as srv:
        killed = start_cli(args_for(data, tmp_path / "out", srv), tmp_path)
        try:
            wait_until(lambda: run.batch_records(), killed, what="a first finished prompt")
        finally:
            kill_group(killed)
        assert (run.path / "session.lock").exists()
        resumed = run_cli(args_for(data, tmp_path / "out", srv, "--resume"), tmp_path)
    assert_clean_exit(resumed)
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(PROMPTS)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def command_line(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:  # gone, or a zombie
        return ""


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a killed orphan may stay a zombie until init reaps it: that is dead)."""
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def kill_runner_only(proc: subprocess.Popen) -> None:
    """kill -9 of the runner alone, as an OOM killer would: its children are not signalled."""
    proc.kill()
    proc.wait(timeout=30)


def test_workers_die_with_a_runner_killed_with_kill_9(tmp_path):
    prompts = [f"orphan prompt {i}" for i in range(40)]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    with ScriptedServer(default_script=[ANSWER], latency=1.5) as srv:
        # 256 sessions: a worker process per core (up to 2), each with its threads.
        args = args_for(data, tmp_path / "out", srv, "--concurrency=256", run_name="orphans")
        proc = start_cli(args, tmp_path)
        children: list[psutil.Process] = []
        try:
            wait_until(lambda: len(srv.requests()) >= 4, proc, what="four calls in flight")
            children = descendants(proc.pid)
            # The runner's own children: a worker's child forked a moment ago (a sandbox starting beside its
            # sample's first model call) carries the name br-worker until it execs.
            workers = [p for p in psutil.Process(proc.pid).children() if p.name() == "br-worker"]
            assert len(workers) == min(2, os.cpu_count() or 1), [(p.name(), command_line(p)) for p in children]
            kill_runner_only(proc)
            time.sleep(1.0)  # a call sent at the very moment of the kill may still arrive
            calls_at_kill = len(srv.requests())
            deadline = time.monotonic() + 30
            while alive(children) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = alive(children)
            # Every call in flight was answered within 1.5 s: a surviving worker would have asked again.
            time.sleep(4)
            calls_after = len(srv.requests())
        finally:
            kill_group(proc)
            for p in alive(children):  # orphans are not in the process group's reach once re-parented
                p.kill()
    assert left == [], f"outlived the runner: {[(p.pid, command_line(p)) for p in left]}"
    assert calls_after == calls_at_kill, f"{calls_after - calls_at_kill} paid calls after the runner died"


def chromium_of(pids: set[int]) -> list[psutil.Process]:
    """Chromium processes of the runs' browser sessions (their command line carries the session marker)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if browser_session.MARKER_FLAG in " ".join(p.info["cmdline"] or []) and p.pid not in pids:
            out.append(p)
    return out


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(
    browser_session.unavailable_reason(ToolSettings().browser_executable) is not None,
    reason="Chromium or Playwright missing",
)
def test_browsers_die_with_a_runner_killed_with_kill_9(tmp_path):
    site = FakeSite({"/page": lambda seen: html_reply(b"<html><body><h1>Hello</h1></body></html>")})
    before = {p.pid for p in chromium_of(set())}
    data = write_dataset(tmp_path / "ds.jsonl", ["browse"])
    script = {
        "browse": [
            {"tool_calls": [{"name": "browser_navigate", "arguments": {"url": f"{site.url}/page"}}]},
            dict(ANSWER, latency=120),  # the prompt is in flight, its browser open, when the runner dies
        ]
    }
    try:
        with ScriptedServer(script=script) as srv:
            args = args_for(data, tmp_path / "out", srv, "--distribution=browser_only", "--allow_private_urls=true")
            proc = start_cli([*args, "--run_name=browsers"], tmp_path)
            try:
                wait_until(lambda: len(srv.requests()) >= 2, proc, seconds=120, what="the page to be read")
                browsers = chromium_of(before)
                assert browsers, "no Chromium was started"
                kill_runner_only(proc)
                deadline = time.monotonic() + 30
                while alive(browsers) and time.monotonic() < deadline:
                    time.sleep(0.2)
                left = alive(browsers)
            finally:
                kill_group(proc)
    finally:
        site.close()
        for p in alive(chromium_of(before)):
            p.kill()
    assert left == [], f"Chromium outlived the runner: {[p.pid for p in left]}"


def low_fd_limit(limit: int):
    """preexec_fn: the runner may hold only `limit` files, soft and hard: too few for its workers' pipes."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return apply


@pytest.mark.parametrize("verbose", [False, True])
def test_workers_that_cannot_be_started_are_not_reported_as_a_full_disk(tmp_path, verbose):
    """Too few files for the workers' pipes: one line naming the limit before anything starts, never a
    failed write, and nothing made or paid for."""
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    with ScriptedServer(default_script=[ANSWER]) as srv:
        proc = subprocess.run(
            cli_command(args_for(data, tmp_path / "out", srv, f"--verbose={verbose}")),
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=low_fd_limit(20),
        )
        assert srv.requests() == []
    assert proc.returncode == 2, proc.stderr
    assert "free space" not in proc.stderr and "cannot write to" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    assert "open files" in errors[0] and "ulimit -Hn" in errors[0], errors[0]
    assert ("Traceback" in proc.stderr) is verbose, proc.stderr  # --verbose: tracebacks on fatal errors
    assert not (Path(tmp_path) / "out" / "locked").exists()
