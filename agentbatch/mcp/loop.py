"""This process's event loop for its MCP clients: one daemon thread, which the samples' threads hand coroutines to.

The MCP SDK is asynchronous and a worker's samples are threads, so each process (the runner at start, each
worker) runs one asyncio loop on a thread of its own, started on first use and again in a forked child
(a thread does not survive a fork). A sample's thread waits for its coroutine's result with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_pid = 0


def get() -> asyncio.AbstractEventLoop:
    """This process's MCP event loop, started on first use."""
    global _loop, _thread, _pid
    loop = _loop
    if loop is not None and _pid == os.getpid():
        return loop
    with _lock:
        if _loop is None or _pid != os.getpid():
            _loop = asyncio.new_event_loop()
            _pid = os.getpid()
            _thread = threading.Thread(target=_loop.run_forever, name="mcp-loop", daemon=True)
            _thread.start()
        return _loop


def stop() -> None:
    """End the loop and its thread (and its pool's): the runner, after listing the tools at start, forks its
    workers only while it is one thread again. A later use starts another."""
    global _loop, _thread
    with _lock:
        loop, thread = _loop, _thread
        if loop is None or _pid != os.getpid():
            return
        _loop = _thread = None
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(10)
    if not loop.is_running():
        loop.close()


def run(coro: Coroutine[Any, Any, T], timeout: float) -> T:
    """The coroutine's result, run on the loop; TimeoutError (and the coroutine cancelled) after `timeout` s."""
    future = asyncio.run_coroutine_threadsafe(coro, get())
    try:
        return future.result(max(timeout, 0.001))
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"no answer in {timeout:g} s") from None


def submit(coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Start the coroutine on the loop and return at once."""
    return asyncio.run_coroutine_threadsafe(coro, get())
