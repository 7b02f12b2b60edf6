"""The local and bwrap sandboxes' temporary directories, named after the process that owns them.

`br-sandbox-<pid>.<start time>-<random>` in the temp directory: the name alone says whose it is, so
after a worker dies (or a session is killed) the parent can tell a dead owner's leftovers from a live
sandbox of another run without any file a command could tamper with, and remove them (`reap_dead`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from functools import cache

from agentbatch.sandboxes import closing, containment
from agentbatch.sandboxes.base import Backend, SandboxError

PREFIX = "br-sandbox-"
NAMES_SUFFIX = "-names"  # a process's names directory (names_dir); mkdtemp's random suffixes hold no "-"
_NAME = re.compile(rf"^{PREFIX}(\d+)\.(\d+)-")


def process_start(pid: int, running: bool = False) -> int | None:
    """A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None if it is gone.

    `running`: None also for a zombie, dead and only waiting to be reaped (a killed runner's workers wait
    for the init that inherited them, which may be slow to reap them).
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except OSError:
        return None
    # Field 2 (the command name) may hold spaces and parentheses: count fields after its closing ")".
    fields = stat_line[stat_line.rfind(b")") + 2 :].split()
    if running and fields[:1] in ([b"Z"], [b"X"]):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@cache
def _owner_tag(pid: int) -> str:
    return f"{pid}.{process_start(pid) or 0}"


def owner_tag() -> str:
    """This process's `<pid>.<start time>` (a forked child gets its own)."""
    return _owner_tag(os.getpid())


def make(mode: int = 0o700, reachable: bool = False) -> str:
    """A fresh sandbox directory owned by this process; `reachable`: in a directory any user may pass through."""
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{owner_tag()}-", dir=shared_base() if reachable else None)
    os.chmod(path, mode)
    return path


def names_dir() -> str:
    """This process's directory for its local resident shells' names (shell_program), 0700, made if missing: named
    like a sandbox's, so that a dead owner's is reaped with them, but not counted as one."""
    path = os.path.join(tempfile.gettempdir(), f"{PREFIX}{owner_tag()}{NAMES_SUFFIX}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)  # only a directory no one else may write to is trusted with the link
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise SandboxError(f"{path} is not a directory of this user's alone: remove it")
    return path


def shared_base() -> str:
    """The temp directory if every user may pass through it (bwrap binds from the sandbox user's view), else /tmp."""
    base = tempfile.gettempdir()
    path = base
    while True:
        try:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return "/tmp"
        except OSError:
            return "/tmp"
        if path == "/":
            return base
        path = os.path.dirname(path)


def _bases() -> set[str]:
    return {tempfile.gettempdir(), shared_base()}


def owner_alive(name: str) -> bool:
    """Whether the process named in a sandbox directory's name still runs (True if the name is not ours)."""
    m = _NAME.match(name)
    if not m:
        return True
    pid, start = int(m.group(1)), int(m.group(2))
    return process_start(pid, running=True) == start


def dead_leftovers() -> list[str]:
    """Paths of this user's sandbox directories whose owner process is dead."""
    out = []
    for base in _bases():
        try:
            names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
        except OSError:
            continue
        out += _dead(base, names)
    return out


def _dead(base: str, names: list[str]) -> list[str]:
    out = []
    for name in names:
        path = os.path.join(base, name)
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not owner_alive(name):
            out.append(path)
    return out


def remove(path: str) -> None:
    """Remove a sandbox directory whatever a command did to its modes; never raises, and does nothing once it is gone."""

    def unlock(func, failed, _exc) -> None:
        # A command may have left a directory without write or search permission: restore it and retry. Only
        # below `path`: the directory it lies in (the temp directory) is never changed, also when `path` is gone.
        if failed != path and not failed.startswith(path + os.sep):
            return
        with contextlib.suppress(OSError):
            if failed != path:
                os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    with contextlib.suppress(OSError):
        shutil.rmtree(path, onerror=unlock)


def reap_dead() -> int:
    """Remove the sandboxes whose worker died (of any run of this user): their processes, cgroups and directories."""
    dead = dead_leftovers()
    names = {os.path.basename(p) for p in dead}
    for cgroup in containment.cgroups_named({n + "." for n in names}):
        containment.kill_cgroup(cgroup)
    containment.kill_tagged(names, nested=True)
    for path in dead:
        remove(path)
    return sum(1 for path in dead if not path.endswith(NAMES_SUFFIX))


class WorkerDirBackend(Backend):
    """A backend whose sandboxes are such directories (local, bwrap): removed with them, reaped by dead worker.

    Not paced by --sandbox_starts: `create` makes a sample's directories and starts nothing (the shell starts
    apart, at `warm` or the first command). Under permits, the samples of a wave queued behind a few mkdirs of
    threads that waited for the GIL, before their first model call: bench (19) at 1,000 × 2, a sample's first
    request 179-199 ms after its start on average, 48-59 ms without (bench/RESULTS.md)."""

    paced = False

    def cleanup(self, sandbox, interrupted: bool) -> None:
        closing.defer(sandbox.cleanup)  # after the sample's outcome has gone back (closing.py)

    def reap(self, labels: dict[str, str]) -> int:
        """Any run's sandboxes whose worker died, whatever the labels: a live worker's are never touched."""
        return reap_dead()

    def reaped(self, n: int, whose: str) -> str:
        return f"removed {n} {self.name} sandboxes whose worker had died"
