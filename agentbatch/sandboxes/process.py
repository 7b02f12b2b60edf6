"""Long-lived processes of the local and bwrap sandboxes (Sandbox.start): pipes to stdin and stdout, stderr kept
bounded, and started from a thread that lives as long as the worker.

A child that must die with its worker is tied to it by PR_SET_PDEATHSIG (`setpriv --pdeathsig`, bwrap's
`--die-with-parent`), which the kernel fires when the thread that started the child exits, not the
process. Commands run and end on their caller's thread; a process that outlives the call is started from
this module's own thread instead, so it ends when it is killed, with its sandbox, or with its worker, and
never because the thread that asked for it (a pool's, say) went away.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from agentbatch.sandboxes.output import KILL_GRACE, BoundedOutput

T = TypeVar("T")
_CHUNK = 65536
_starter_lock = threading.Lock()
_starter: tuple[int, queue.SimpleQueue] | None = None  # (the process it belongs to, its inbox)


def on_lasting_thread(fn: Callable[[], T]) -> T:
    """fn's result (or exception), fn run on this process's own starter thread."""
    return on_lasting_thread_soon(fn).result()


def on_lasting_thread_soon(fn: Callable[[], T]) -> Future:
    """fn handed to this process's own starter thread: its future result, without waiting for it."""
    global _starter
    with _starter_lock:
        if _starter is None or _starter[0] != os.getpid():  # none yet, or a forked copy without the thread
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(inbox,), name="sandbox-starter", daemon=True).start()
            _starter = (os.getpid(), inbox)
        inbox = _starter[1]
    done: Future = Future()
    inbox.put((fn, done))
    return done


def stop_lasting_thread() -> None:
    """End this process's starter thread, once every process it started has ended (the runner after the MCP
    servers' listing at start: it forks its workers only while it is one thread). A later start makes another."""
    global _starter
    with _starter_lock:
        starter, _starter = _starter, None
    if starter is not None and starter[0] == os.getpid():
        done: Future = Future()
        starter[1].put((None, done))
        done.result()


def _serve(inbox: queue.SimpleQueue) -> None:
    while True:
        fn, done = inbox.get()
        if fn is None:
            done.set_result(None)
            return
        try:
            done.set_result(fn())
        except BaseException as e:
            done.set_exception(e)


STDERR_SETTLE = 2.0  # seconds stderr() waits, once, for an exited process's pipe to be read to its end


class PipeProcess:
    """A Process (base.Process) over a child's pipes; `end(popen)` kills it and everything it started."""

    def __init__(self, popen: subprocess.Popen, end: Callable[[subprocess.Popen], None]):
        self._popen = popen
        self._end = end
        self.stdin = popen.stdin
        self.stdout = popen.stdout
        self._errors = BoundedOutput()
        self._lock = threading.Lock()
        self._ended = False
        self._settled = False  # stderr() has waited for the pipe's end after the exit
        # Drained all along: a process whose stderr pipe filled up would stop.
        self._drain = threading.Thread(target=self._read_stderr, name="sandbox-stderr", daemon=True)
        self._drain.start()

    def _read_stderr(self) -> None:
        fd = self._popen.stderr.fileno()
        while True:
            try:
                data = os.read(fd, _CHUNK)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self._errors.add(data)

    def stderr(self) -> str:
        """What it wrote to stderr (bounded). Once it has exited, what its pipe still held is read first: the
        reading thread lags behind on a busy machine (waited for once, at most STDERR_SETTLE seconds, since
        something it started may hold the pipe open)."""
        if not self._settled and self._popen.poll() is not None:
            self._drain.join(timeout=STDERR_SETTLE)
            self._settled = True
        with self._lock:
            return self._errors.text()

    def poll(self) -> int | None:
        return self._popen.poll()

    def kill(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._end(self._popen)
        with contextlib.suppress(OSError, ValueError):
            self.stdin.close()
        try:
            self._popen.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()
        self._drain.join(timeout=KILL_GRACE)
        if not self._drain.is_alive():  # else something outside the containment holds them: left to the GC
            self._popen.stderr.close()
            self.stdout.close()  # a reader of it has its EOF by now
