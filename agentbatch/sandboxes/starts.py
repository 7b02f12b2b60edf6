"""How many sandboxes this process creates at once (--sandbox_starts, shared out among the worker processes).

Creating a container is the engine's heaviest work in an agent run: hundreds of `docker create` and `start`
at once slow it down for everyone (and for every sample already running), so creation is paced apart from
the samples in flight: a sample waits for a start permit, then runs at the run's concurrency.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_permits: dict[int, threading.Semaphore] = {}


def _semaphore(limit: int) -> threading.Semaphore:
    with _lock:
        if limit not in _permits:
            _permits[limit] = threading.Semaphore(limit)
        return _permits[limit]


@contextlib.contextmanager
def start_permit(limit: int, timeout: float | None = None) -> Iterator[bool]:
    """Hold one of `limit` start permits (0: no limit) while the block runs; yields False if `timeout` passed first."""
    if limit <= 0:
        yield True
        return
    permits = _semaphore(limit)
    if not permits.acquire(timeout=timeout):
        yield False
        return
    try:
        yield True
    finally:
        permits.release()
