"""A sandbox's removal finished after its sample's outcome has gone back, on a few threads of the process.

Removing a bwrap or local sandbox is mostly waiting: for its shell and namespace to end, for the file system to
remove its directories (and for the GIL between their system calls, among a worker's busy threads): 40-60 ms
on average in a run of 256 samples at once on two cores, where it held the sample's slot, and so the next
sample's first model call, that long (bench (19), bench/RESULTS.md). A backend hands that removal here
(`defer`) and its sample's slot goes on at once; the removal itself is unchanged, and still happens whatever
ended the sample.

What bounds it: at most CLOSERS threads per process, and at most PENDING removals waiting; past that the
caller removes its sandbox itself, as before, so a run never holds more than that many ended sandboxes.
A worker waits for every removal before it exits (`drain`); the runner's own process at its exit too. What a
killed process left, the next session's reap removes, as before.
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

_lock = threading.Lock()
_state: dict = {}  # this process's: {"pid", "inbox", "threads", "pending", "idle" (an Event: nothing pending)}


def defer(remove: Callable[[], None]) -> None:
    """Run `remove` on a closer thread of this process, or on the caller's when PENDING are waiting already.
    `remove` never raises (a backend's clean-up); if it does, the error is logged and nothing else."""
    with _lock:
        state = _current()
        if state["pending"] >= PENDING or not _enough_threads(state, state["pending"] + 1):
            state = None
        else:
            state["pending"] += 1
            state["idle"].clear()
    if state is None:
        _run(remove)
    else:
        state["inbox"].put(remove)


def drain(timeout: float | None = None) -> bool:
    """Wait until every removal handed to this process's closers is done; whether they all were within `timeout`."""
    with _lock:
        state = _state if _state.get("pid") == os.getpid() else None
    return state is None or state["idle"].wait(timeout)


def _enough_threads(state: dict, pending: int) -> bool:
    """Start a closer thread if `pending` removals need one more (up to CLOSERS); whether any closer runs."""
    if len(state["threads"]) < min(CLOSERS, pending):
        thread = threading.Thread(target=_serve, args=(state,), name="sandbox-closer", daemon=True)
        try:
            thread.start()
            state["threads"].append(thread)
        except RuntimeError:  # the machine gives no more threads: those there are do, or the caller
            pass
    return bool(state["threads"])


def _current() -> dict:
    """This process's closers (a forked child starts with none: its parent's threads are not in it)."""
    if _state.get("pid") != os.getpid():
        idle = threading.Event()
        idle.set()
        _state.clear()
        _state.update(pid=os.getpid(), inbox=queue.SimpleQueue(), threads=[], pending=0, idle=idle)
    return _state


def _serve(state: dict) -> None:
    while True:
        _run(state["inbox"].get())
        with _lock:
            state["pending"] -= 1
            if state["pending"] == 0:
                state["idle"].set()


def _run(remove: Callable[[], None]) -> None:
    try:
        remove()
    except Exception as e:  # a backend's bug; what it left, the next reap removes
        log.warning("a sandbox's removal failed: %s: %s", type(e).__name__, e)


atexit.register(drain, 60.0)  # the runner's own process (a forked worker drains in its own end: it leaves by os._exit)
