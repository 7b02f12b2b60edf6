"""A sandbox's removal finished after its sample's outcome has gone back, on a few threads of the process.

Removing a bwrap or local sandbox is mostly waiting: for its shell and namespace to end, for the file system to
remove its directories (and for the GIL between their system calls, among a worker's busy threads): 40-60 ms
on average in a run of 256 samples at once on two cores, where it held the sample's slot, and so the next
sample's first model call, that long (bench (19), bench/RESULTS.md). A backend hands that removal here
(`defer`) and its sample's slot goes on at once; the removal itself is unchanged, and still happens whatever
ended the sample.

What bounds it: at most CLOSERS threads per process, and at most PENDING removals waiting; past that the
caller removes its sandbox itself, as before, so a run never holds more than that many ended sandboxes.
A worker waits for every removal before it exits (`drain`); the runner's own process at its exit too; a
session's last reap comes after its workers have exited, so that a backend that reaps by label (docker's)
could defer as well. What a killed process left, the next session's reap removes, as before.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

CLOSERS = 4  # threads per process that remove sandboxes
PENDING = 128  # removals waiting or under way in a process, at most (a worker's slots: one wave of samples)


class _Closers:
    """One process's closer threads and the removals handed to them (a forked child makes its own: its parent's
    threads are not in it)."""

    def __init__(self):
        self.pid = os.getpid()
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = 0
        self.pending = 0  # handed over and not yet done


_done = threading.Condition()  # guards _closers; notified when a process's pending removals reach 0
_closers: _Closers | None = None


def defer(remove: Callable[[], None]) -> None:
    """Run `remove` on a closer thread of this process, or on the caller's when PENDING are waiting already (or no
    closer thread can start). `remove` never raises (a backend's clean-up); if it does, the error is logged."""
    with _done:
        closers = _current()
        if closers.pending >= PENDING or not _enough_threads(closers, closers.pending + 1):
            closers = None
        else:
            closers.pending += 1
    if closers is None:
        _run(remove)
    else:
        closers.inbox.put(remove)


def drain(timeout: float | None = None) -> bool:
    """Wait until every removal handed to this process's closers is done; whether they all were within `timeout`."""
    with _done:
        closers = _current()
        return _done.wait_for(lambda: closers.pending == 0, timeout)


def _enough_threads(closers: _Closers, pending: int) -> bool:
    """Start a closer thread if `pending` removals need one more (up to CLOSERS); whether any closer runs."""
    if closers.threads < min(CLOSERS, pending):
        thread = threading.Thread(target=_serve, args=(closers,), name="sandbox-closer", daemon=True)
        try:
            thread.start()
            closers.threads += 1
        except RuntimeError:  # the machine gives no more threads: those there are do, or the caller
            pass
    return closers.threads > 0


def _current() -> _Closers:
    """This process's closers (the caller holds _done)."""
    global _closers
    if _closers is None or _closers.pid != os.getpid():
        _closers = _Closers()
    return _closers


def _serve(closers: _Closers) -> None:
    while True:
        _run(closers.inbox.get())
        with _done:
            closers.pending -= 1
            if closers.pending == 0:
                _done.notify_all()


def _run(remove: Callable[[], None]) -> None:
    try:
        remove()
    except Exception as e:  # a backend's bug; what it left, the next reap removes
        log.warning("a sandbox's removal failed: %s: %s", type(e).__name__, e)


atexit.register(drain, 60.0)  # the runner's own process (a forked worker drains in its own end: it leaves by os._exit)
