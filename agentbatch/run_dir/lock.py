"""The locks of a run directory: the session's (one session at a time) and the exports' (one export at a time).

Both are exclusive flocks: the kernel drops one when its holder exits, however it dies (kill -9, OOM, power
loss), so a stale file never blocks anyone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from collections.abc import Iterator

from agentbatch.errors import FatalError
from agentbatch.run_dir.paths import EXPORT_LOCK, LOCK, RunPaths


@contextlib.contextmanager
def session_lock(paths: RunPaths, session: str, started: str) -> Iterator[None]:
    """Hold the run directory for this session until it ends: a second session is refused with one line.

    session.lock says who holds it. Raises FatalError when another live session holds it or the directory
    cannot be written.
    """
    try:
        os.makedirs(paths.dir, exist_ok=True)
        fd = os.open(paths.path(LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise FatalError(f"cannot write to {paths.dir}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FatalError(
                f"{paths.dir} is in use by another session{_holder(fd)}; wait for it to end (or stop it), "
                "then run again with --resume"
            ) from None
        except OSError as e:
            raise FatalError(f"cannot write to {paths.dir}: {e.strerror}") from None
        info = {"session": session, "pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)  # the file stays: what it says is only read while someone holds it


@contextlib.contextmanager
def export_lock(paths: RunPaths) -> Iterator[None]:
    """Hold export/ while an export writes there: a second export of the run waits for the first to end, so
    neither removes the other's folder in the making nor loses the other's entry of export/report.json."""
    os.makedirs(paths.export(), exist_ok=True)
    fd = os.open(paths.export(EXPORT_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"export: waiting for another export of {paths.dir} to end", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    """' (pid N on HOST, started T)' from a held lock file; empty if it cannot be read yet."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict):
        return ""
    return f" (pid {info.get('pid')} on {info.get('host')}, started {info.get('started')})"
