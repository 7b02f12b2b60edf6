"""A `docker exec`'s attached stream: its frames read under a deadline, and a long-lived exec as a Process.

Without a TTY the engine multiplexes stdout and stderr on one connection, each frame led by 8 bytes
(stream number, size); stdin, when attached, is the same connection's other direction.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

import requests
from docker.utils.socket import read as socket_read

from agentbatch.sandboxes.output import KILL_GRACE, BoundedOutput

STDOUT, STDERR = 1, 2
_CHUNK = 65536


def pump(sock, deadline: float | None, deliver: Callable[[int, bytes], None]) -> bool:
    """Hand each frame's (stream, bytes) to deliver until EOF (True) or the deadline (False; None: no deadline)."""
    pending = bytearray()
    while True:
        if not _wait_readable(sock, None if deadline is None else deadline - time.monotonic()):
            return False
        data = socket_read(sock, _CHUNK)
        if not data:
            return True
        pending += data
        while len(pending) >= 8:
            size = struct.unpack(">L", pending[4:8])[0]
            if len(pending) < 8 + size:
                break
            deliver(pending[0], bytes(pending[8 : 8 + size]))
            del pending[: 8 + size]


def _wait_readable(sock, remaining: float | None) -> bool:
    if getattr(sock, "pending", None) and sock.pending():  # TLS may hold decrypted bytes select cannot see
        return True
    if remaining is not None and remaining <= 0:
        return False
    ready, _, _ = select.select([sock], [], [], remaining)
    return bool(ready)


def close(sock) -> None:
    """Drop the exec connection for good, even if a straggler process still holds its output open."""
    raw = getattr(sock, "_sock", sock)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        raw.shutdown(socket.SHUT_RDWR)
    response = getattr(sock, "_response", None)
    with contextlib.suppress(OSError, ValueError, requests.RequestException):
        if response is not None:
            response.close()
        sock.close()


class _StdinWriter(io.RawIOBase):
    """The process's stdin: writes go to the exec connection, close() half-closes it (the process reads EOF)."""

    def __init__(self, sock):
        self._raw = getattr(sock, "_sock", sock)

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._raw.sendall(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(OSError):
                self._raw.shutdown(socket.SHUT_WR)
        super().close()


class ExecProcess:
    """A Process (base.Process) over a `docker exec` with stdin attached, whose first stderr line is its PID.

    A thread reads the connection: stdout frames into a pipe (`stdout`), stderr into bounded memory.
    `exit_code()` asks the engine; `end(pid)` kills the process and everything it started.
    """

    def __init__(self, sock, exit_code: Callable[[], int | None], end: Callable[[str | None], None]):
        self._sock = sock
        self._exit_code = exit_code
        self._end = end
        self.stdin = io.BufferedWriter(_StdinWriter(sock))
        read, self._write = os.pipe()
        self.stdout = os.fdopen(read, "rb")
        self._errors = BoundedOutput()
        self._first = bytearray()  # stderr until its first newline: the PID
        self._pid: str | None = None
        self._lock = threading.Lock()
        self._ended = False
        self._reader = threading.Thread(target=self._read, name="sandbox-exec", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            pump(self._sock, None, self._deliver)
        except OSError:
            pass  # the connection was closed under it: kill()
        finally:
            os.close(self._write)

    def _deliver(self, stream: int, data: bytes) -> None:
        if stream == STDOUT:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self._write, view) :]
                except BrokenPipeError:  # nobody reads stdout any more
                    return
            return
        with self._lock:
            if self._pid is None:
                self._first += data
                line, newline, rest = bytes(self._first).partition(b"\n")
                if not newline:
                    return
                self._pid, data = line.decode("ascii", "replace").strip(), rest
            self._errors.add(data)

    def stderr(self) -> str:
        with self._lock:
            return self._errors.text()

    def poll(self) -> int | None:
        return self._exit_code()

    def kill(self) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
            pid = self._pid
        self._end(pid)
        with contextlib.suppress(OSError, ValueError):
            self.stdin.close()
        self._reader.join(timeout=KILL_GRACE)
        close(self._sock)  # a straggler holding the output cannot keep the thread reading
        if self._reader.is_alive():
            self.stdout.close()  # nor can a full pipe nobody reads: its write fails now
            self._reader.join(timeout=KILL_GRACE)
        self.stdout.close()  # a reader of it has its EOF by now
