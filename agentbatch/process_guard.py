"""The runner's own processes: they die with the runner, and no other process of the user can read them.

- Parent death: a worker whose runner was killed (kill -9, OOM) would go on calling the paid endpoint for
  samples whose results nobody will record. The kernel's parent-death signal kills it with the runner.
- A tool's fork: a process a worker forks (a tool calling os.fork, or multiprocessing) would outlive it
  forever; it dies with the thread that forked it, so at the latest with its worker.
- Inspection: a local-sandbox command runs as the runner's user, so it could read the API key out of the
  runner's or a worker's memory (/proc/<pid>/mem, ptrace). A non-dumpable process refuses both to any
  process lacking CAP_SYS_PTRACE. (A runner started as root gives its commands that capability: there only
  a container or an isolated sandbox keeps them out.)

Linux only; elsewhere every function here does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterable

import agentbatch.secrets_guard as secrets_guard

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4


_libc: list = []  # loaded once: a forked child must not dlopen (another thread may have held its lock)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        if not _libc:
            _libc.append(ctypes.CDLL(None, use_errno=True))
        return _libc[0].prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent(parent_pid: int | None = None) -> None:
    """SIGKILL this process when its parent dies; exit at once if the parent is already gone."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pid is None:
        parent = multiprocessing.parent_process()
        parent_pid = parent.pid if parent is not None else None
    # The parent may have died before the signal was asked for: then we were re-parented already.
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


_forker = 0  # the process about to fork, noted by the at-fork hook (the child's expected parent)


def _note_forker() -> None:
    global _forker
    _forker = os.getpid()


def _die_with_forker() -> None:
    _die_with_parent(_forker)


def forbid_inspection() -> bool:
    """Make this process non-dumpable: no /proc/<pid>/mem, environ or ptrace for processes without privilege."""
    return _prctl(_PR_SET_DUMPABLE, 0)


def guard_worker(secrets: Iterable[str], die_with_parent: bool = True) -> None:
    """At the start of a worker process: die with the runner (and what it forks with it), refuse inspection,
    redact every log line.

    A worker logs warnings only, as the runner's format: --verbose's line per sample is the runner's.
    """
    if die_with_parent:
        _die_with_parent()
    if sys.platform.startswith("linux"):
        os.register_at_fork(before=_note_forker, after_in_child=_die_with_forker)
    forbid_inspection()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    secrets_guard.redact_logs(secrets_guard.Redactor(secrets))
