"""The runner's own processes: they die with the runner, and no other process of the user can read them.

- Parent death: a worker whose runner was killed (kill -9, OOM) would go on calling the paid endpoint for
  samples whose results nobody will record. The kernel's parent-death signal kills it with the runner.
- A tool's fork: a process a worker forks (a tool calling os.fork, or multiprocessing) would outlive it
  forever; it dies with the thread that forked it, so at the latest with its worker.
- A tool's subprocess: a process a tool starts with `subprocess` (which forks without the at-fork hook) and
  leaves running is ended with its worker: at the worker's end by the worker, and by the runner when it kills
  a worker (Ctrl-C with samples in flight), every process below the worker stopped first, then killed. A
  process that left the worker's tree (a double fork, a daemon) before that is beyond reach.
- Inspection: a local-sandbox command runs as the runner's user, so it could read the API key out of the
  runner's or a worker's memory (/proc/<pid>/mem, ptrace). A non-dumpable process refuses both to any
  process lacking CAP_SYS_PTRACE. (A runner started as root gives its commands that capability: there only
  a container or an isolated sandbox keeps them out.)

Linux only; elsewhere every function here does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import time
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


def _children(pid: int) -> list[int]:
    """The live children of `pid` (zombies left out: they run nothing, and are their parent's to reap)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/stat", "rb") as f:
                    state = f.read().rpartition(b")")[2].split()[0]
            except (OSError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                found.append(kid)
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before their children."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_tree(pid: int, include_root: bool = True, within: float = 2.0) -> None:
    """Kill every process below `pid` (and `pid` itself with `include_root`): each stopped as it is found, so that
    none forks past the walk, then all killed, until a walk finds none left (or `within` seconds passed)."""
    if not sys.platform.startswith("linux"):
        return
    if include_root:
        _signal_all([pid], signal.SIGSTOP)
    deadline = time.monotonic() + within
    while True:
        found, seen = [], set()
        while True:  # stop what the walk finds, and walk again until it finds nothing new
            new = [p for p in descendants(pid) if p not in seen]
            if not new:
                break
            _signal_all(new, signal.SIGSTOP)
            seen.update(new)
            found += new
        _signal_all(([pid] if include_root else []) + found, signal.SIGKILL)
        if not found or time.monotonic() > deadline:
            return
        time.sleep(0.005)  # the killed leave the walk as they die; what they forked before shows on the next


def end_own_children() -> None:
    """At a worker's end: end every process its tools started and left running."""
    end_tree(os.getpid(), include_root=False)
