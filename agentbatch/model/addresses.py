"""Where an endpoint's host name points, looked up once for all the connections a run opens to it.

A run at --concurrency=1024 opens 1,024 connections in its first second, and socket.create_connection asks the
resolver on every one: 1,024 lookups of one name at once, which a hosted endpoint's DNS (or a local resolver's
rate limit) can answer with "Temporary failure in name resolution" for some of them. Here one thread asks and
the others wait for its answer; the answer is kept for a minute, and forgotten as soon as no address it gave
can be reached, so a moved endpoint is followed.
"""

from __future__ import annotations

import socket
import threading
import time

KEEP_SECONDS = 60.0  # how long an answer is reused before the resolver is asked again


class _Lookup:
    """One question to the resolver, answered once for every thread that asked it meanwhile."""

    def __init__(self) -> None:
        self.answered = threading.Event()
        self.addresses: list[tuple] = []
        self.error: OSError | None = None
        self.until = 0.0


_lookups: dict[tuple[str, int], _Lookup] = {}
_lock = threading.Lock()


def connect(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP socket connected to host:port (socket.create_connection's job), trying each address in turn."""
    error: OSError | None = None
    for family, kind, proto, _, address in _addresses(host, port, timeout):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            error = e
    forget(host, port)  # none answered: the next connection asks the resolver again
    raise error or OSError(f"no address for {host}")


def forget(host: str, port: int) -> None:
    with _lock:
        _lookups.pop((host, port), None)


def _addresses(host: str, port: int, timeout: float) -> list[tuple]:
    key = (host, port)
    with _lock:
        lookup = _lookups.get(key)
        # A failed lookup's `until` is 0: the next connection asks again.
        asking = lookup is None or (lookup.answered.is_set() and lookup.until <= time.monotonic())
        if asking:
            lookup = _lookups[key] = _Lookup()
    if asking:
        try:
            lookup.addresses = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            lookup.until = time.monotonic() + KEEP_SECONDS
        except OSError as e:
            lookup.error = e
        finally:
            lookup.answered.set()
    elif not lookup.answered.wait(timeout):
        raise TimeoutError(f"looking up {host} took over {timeout:g} s")
    if lookup.error is not None:
        raise type(lookup.error)(*lookup.error.args)  # each thread its own: a shared one's traceback would grow
    return lookup.addresses
