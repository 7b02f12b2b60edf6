"""httpx clients whose requests end by an overall deadline, not only within a limit per read.

httpx's timeouts bound each connect, read and write on its own: a server that trickles a byte a second
never trips a 3 s read timeout, so one call could last for ever. Inside `deadline(seconds)`, every socket
operation of a request made on that thread through a `client()` waits at most what is left of the
deadline, and fails as a timeout (httpx.TimeoutException) once it has passed. Connections stay pooled:
the deadline belongs to the thread's current request, not to the connection.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

_state = threading.local()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Requests made in this block on this thread end within `seconds` (an outer, earlier deadline still holds)."""
    outer = getattr(_state, "at", None)
    at = time.monotonic() + max(float(seconds), 0.0)
    _state.at = at if outer is None else min(outer, at)
    try:
        yield
    finally:
        _state.at = outer


def remaining() -> float | None:
    """Seconds left of this thread's deadline (0 once passed); None outside `deadline`."""
    at = getattr(_state, "at", None)
    return None if at is None else max(0.0, at - time.monotonic())


def client(**kwargs: Any) -> httpx.Client:
    """An httpx.Client (same arguments) whose requests honour `deadline`, proxies from the environment included."""
    made = httpx.Client(**kwargs)
    # httpx offers no public hook below the transport; the network backend is where every socket call passes.
    for transport in (made._transport, *made._mounts.values()):
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if transport is not None and backend is None:
            raise RuntimeError(f"httpx {httpx.__version__} has no network backend to bound: update http_deadline.py")
        if backend is not None and not isinstance(backend, _Backend):
            pool._network_backend = _Backend(backend)
    return made


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The timeout of one socket operation: its own, cut to what is left of the deadline."""
    at = getattr(_state, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the request's overall deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream):
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
