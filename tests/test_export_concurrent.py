"""Two exports of one run at once, and the export at the end of a session (issue 26 item 15), with real processes.

The first export opens its second batch file only once the test says so (a wrapper of run_dir's file opener
waits on a FIFO of the test's: a FIFO in the run directory itself is no batch file, and no reader opens it), so
the second starts while the first's folder is still being written, every time.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

from cli_helpers import (
    ROOT,
    assert_clean_exit,
    cli_command,
    cli_env,
    read_jsonl,
    run_cli_wrapped,
    thinking,
    write_dataset,
)
from export_pin_run import regular
from scripted_server import ScriptedServer

DEADLINE = 60.0


def line(i: int) -> bytes:
    return (json.dumps(regular(i), ensure_ascii=False) + "\n").encode()


# The real CLI, whose reader waits for the test before it opens batch_1.jsonl.
HELD_OPEN = """
import sys
sys.path.insert(0, {root!r})
from agentbatch.run_dir import lines
real = lines.open_regular
def open_regular(path):
    if path.endswith("batch_1.jsonl"):
        with open({hold!r}, "rb") as f:
            f.read()  # until the test has written and closed the FIFO
    return real(path)
lines.open_regular = open_regular
from batch_runner import cli
cli()
"""


def start_export(run_dir: Path, formats: str, stderr: Path, hold: Path | None = None) -> subprocess.Popen:
    args = [f"--run_name={run_dir.name}", f"--output_dir={run_dir.parent}", f"--export={formats}"]
    command = cli_command(args)
    if hold is not None:
        wrapper = stderr.with_suffix(".py")
        wrapper.write_text(HELD_OPEN.format(root=str(ROOT), hold=str(hold)))
        command = [command[0], str(wrapper), *command[2:]]
    with open(stderr, "w") as err:
        return subprocess.Popen(command, cwd=run_dir.parent, env=cli_env(), stdout=subprocess.PIPE, stderr=err)


def wait_for(what: str, condition) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def feed(fifo: Path, data: bytes) -> None:
    """Write `data` to the FIFO once a reader has opened it, then close it (the reader sees the end)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:  # no reader yet
                raise
            assert time.monotonic() < deadline, "no export opened the batch file"
            time.sleep(0.02)
    os.set_blocking(fd, True)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_two_exports_of_one_run_at_once_both_finish_whole(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "batch_0.jsonl").write_bytes(b"".join(line(i) for i in range(20)))
    (run_dir / "batch_1.jsonl").write_bytes(b"".join(line(i) for i in range(20, 30)))
    hold = tmp_path / "hold"
    os.mkfifo(hold)
    first = start_export(run_dir, "openai", tmp_path / "first.err", hold)
    export_dir = run_dir / "export"
    # The first export has made its folder in the making and waits for the rest of the lines.
    wait_for("the first export's folder", lambda: export_dir.is_dir() and any(export_dir.glob(".openai.tmp-*")))
    second = start_export(run_dir, "openai,hermes", tmp_path / "second.err")
    wait_for(
        "the second export to start",
        lambda: (
            "waiting for another export" in (tmp_path / "second.err").read_text()
            or (export_dir / f".openai.tmp-{second.pid}").exists()
        ),
    )
    feed(hold, b"go")
    first.communicate(timeout=DEADLINE)
    second.communicate(timeout=DEADLINE)
    errors = {name: (tmp_path / f"{name}.err").read_text() for name in ("first", "second")}
    assert (first.returncode, second.returncode) == (0, 0), errors
    assert "Traceback" not in errors["first"] + errors["second"]
    assert "waiting for another export" in errors["second"]
    assert len(read_jsonl(export_dir / "openai" / "data.jsonl")) == 30
    assert len(read_jsonl(export_dir / "hermes" / "data.jsonl")) == 30
    report = json.loads((export_dir / "report.json").read_text())
    assert set(report) == {"openai", "hermes"} and report["openai"]["written"] == 30
    assert not [p.name for p in export_dir.iterdir() if p.name.startswith(".")], "a temporary folder was left"


# The real CLI with the end-of-session export wrapped: before it writes, it notes whether another process could
# take the run's lock (a second session could start and change the files it reads).
PROBING_EXPORT = """
import fcntl, os
from agentbatch.export import from_flags
real = from_flags.export
def export(run_dir, *args, **kwargs):
    fd = os.open(os.path.join(run_dir, "session.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        state = "free"
    except BlockingIOError:
        state = "held"
    finally:
        os.close(fd)
    with open({log!r}, "a") as log:
        log.write(state + "\\n")
    return real(run_dir, *args, **kwargs)
from_flags.export = export
"""


def test_the_export_at_the_end_of_a_session_runs_while_it_holds_the_run(tmp_path):
    log = tmp_path / "lock_during_export.txt"
    dataset = write_dataset(tmp_path / "d.jsonl", [f"task {i}" for i in range(3)])
    args = [
        f"--dataset_file={dataset}",
        "--run_name=r",
        f"--output_dir={tmp_path}",
        "--batch_size=5",
        "--export=openai",
    ]
    with ScriptedServer(default_script=[thinking("done")]) as srv:
        done = run_cli_wrapped(PROBING_EXPORT.format(log=str(log)), args, tmp_path, srv)
    assert_clean_exit(done)
    assert log.read_text() == "held\n"
    assert len(read_jsonl(tmp_path / "r" / "export" / "openai" / "data.jsonl")) == 3
