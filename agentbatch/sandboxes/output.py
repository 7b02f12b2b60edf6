"""A command's output kept in bounded memory (head and tail), and a process streamed into it under a deadline.

Every backend keeps the first and the last MAX_KEPT_OUTPUT bytes of what a command prints, so `yes` for a
minute or 200 MB of logs costs a few MiB, never the worker's memory.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

MAX_KEPT_OUTPUT = 2 * 1024 * 1024  # bytes kept from each end of a command's output
KILL_GRACE = 3.0  # seconds the output stream gets to close after its processes were killed
_CHUNK = 65536


class BoundedOutput:
    """A command's output, keeping the head and the tail when it runs past MAX_KEPT_OUTPUT at each end."""

    def __init__(self, keep: int = MAX_KEPT_OUTPUT):
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.cut = 0

    def add(self, data: bytes) -> None:
        room = self.keep - len(self.head)
        if room > 0 and not self.tail:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > 2 * self.keep:
            drop = len(self.tail) - self.keep
            del self.tail[:drop]
            self.cut += drop

    def take_first_line(self) -> str | None:
        """Remove and return the leading PID line; None (and nothing removed) if the output does not start with one."""
        end = self.head.find(b"\n")
        line = bytes(self.head[:end]).strip() if end >= 0 else b""
        if not line.isdigit():
            return None
        del self.head[: end + 1]
        return line.decode("ascii")

    def take_prefix(self, prefix: bytes) -> bool:
        """Remove `prefix` if the output starts with it; whether it did."""
        if not self.head.startswith(prefix):
            return False
        del self.head[: len(prefix)]
        return True

    def data(self) -> bytes:
        mid = f"\n... [{self.cut} bytes cut] ...\n".encode() if self.cut else b""
        return bytes(self.head) + mid + bytes(self.tail)

    def text(self) -> str:
        return self.data().decode("utf-8", "replace")


@dataclass
class Streamed:
    """What a streamed process printed, its exit status (None if it never ended), and whether the deadline hit."""

    output: BoundedOutput
    returncode: int | None
    timed_out: bool


def stream(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    timeout: float,
    kill: Callable[[subprocess.Popen], None],
    settle: Callable[[], None] | None = None,
    pass_fds: tuple[int, ...] = (),
) -> Streamed:
    """Run argv with stdout and stderr into one bounded buffer until it exits or `timeout` passes.

    At the deadline `kill(proc)` must end everything the command started. `settle`, when given, runs once
    the command's own process has exited, to end what it left running (whose open output would otherwise
    hold the stream until the deadline); backends whose processes all die with the command pass None.
    """
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=pass_fds,
    )
    out = BoundedOutput()
    fd = proc.stdout.fileno()
    watch = _ExitWatch(proc) if settle else None
    deadline = time.monotonic() + max(float(timeout), 0.1)
    try:
        finished = _pump(fd, out, deadline, watch, settle)
        if finished:  # the output closed; the command may still run (it closed its stdout)
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                finished = False
        if not finished:
            kill(proc)
            if not _pump(fd, out, time.monotonic() + KILL_GRACE, None, None):
                proc.kill()  # a process outside the containment still holds the pipe: stop reading it
            try:
                proc.wait(timeout=KILL_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return Streamed(out, None, True)
        if settle is not None and not watch.settled:
            settle()
        return Streamed(out, proc.returncode, False)
    finally:
        proc.stdout.close()
        if watch is not None:
            watch.close()


class _ExitWatch:
    """Readable when the process exits (a pidfd); polled instead where pidfds are not available."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.fd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            self.fd = os.pidfd_open(proc.pid)
        self.settled = False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _pump(
    fd: int, out: BoundedOutput, deadline: float, watch: _ExitWatch | None, settle: Callable[[], None] | None
) -> bool:
    """Copy fd into out until EOF (True) or the deadline (False); run settle once the process has exited."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        watching = watch is not None and not watch.settled
        watched = [fd]
        wait = remaining
        if watching:
            if watch.fd is not None:
                watched.append(watch.fd)
            else:
                wait = min(remaining, 0.05)
        ready, _, _ = select.select(watched, [], [], wait)
        if fd in ready:
            data = os.read(fd, _CHUNK)
            if not data:
                return True
            out.add(data)
        if watching and (watch.fd is None or watch.fd in ready) and watch.proc.poll() is not None:
            watch.settled = True
            settle()
