"""The local backend: a fresh temporary directory on this machine (or the row's cwd, used as given).

Not an isolation boundary: commands run as the runner's user and can reach what it can. What it does
guarantee: nothing a command starts outlives the command (containment.py), its output is kept in bounded
memory, and the file tools read and write only inside the prompt's directories, without following
symbolic links, through no hard link and into no FIFO or device (confined.py).
"""

from __future__ import annotations

import itertools
import os
import posixpath

from agentbatch.sandboxes import confined, containment, sandbox_dirs
from agentbatch.sandboxes.base import SAFE_ENV, ExecResult, SandboxError, SandboxSpec
from agentbatch.sandboxes.output import stream

MAX_FILE_BYTES = 64 * 1024 * 1024


class LocalSandbox:
    """A fresh temporary directory on this machine (or the row's cwd, used as given)."""

    def __init__(self, cwd: str | None = None, containment_method: str | None = None):
        if cwd and not os.path.isdir(cwd):
            raise SandboxError(f"cwd {cwd!r} is not a directory on this machine")
        self._cwd = cwd
        self.method = containment_method or containment.best()
        self._count = itertools.count()
        # Made when first needed (a command, a relative path), not for every prompt: creating and removing a
        # directory per prompt queued 1,024 sessions on the file system (bench/RESULTS.md).
        self._tmp: str | None = None
        self._roots = _roots(cwd)

    @property
    def workdir(self) -> str:
        return self._cwd or self._made()

    def _made(self) -> str:
        """The prompt's temporary directory (HOME and TMPDIR of its commands), made on first use."""
        if self._tmp is None:
            self._tmp = sandbox_dirs.make()
            self._name = os.path.basename(self._tmp)
            self._env = dict(SAFE_ENV, HOME=self._tmp, TMPDIR=self._tmp, PWD=self.workdir)
            if self.method == "scan":
                self._env[containment.TAG_VAR] = self._name
            # The file tools' roots: a path the model gives must lie below one of them (as given or resolved).
            self._roots = _roots(self._cwd, self._tmp)
        return self._tmp

    def exec(self, command: str, timeout: float) -> ExecResult:
        self._made()
        cgroup = None
        if self.method == "cgroup":
            try:
                cgroup = containment.new_cgroup(f"{self._name}.{next(self._count)}")
            except OSError as e:
                raise SandboxError(f"cannot make the command's cgroup: {e}") from e
        contained = containment.Command(self.method, command, self._name, cgroup)
        try:
            done = stream(
                contained.argv,
                env=self._env,
                cwd=self.workdir,
                timeout=timeout,
                kill=contained.kill,
                settle=contained.settle,
            )
        finally:
            contained.end()
        if done.timed_out:
            return ExecResult(done.output.text(), -9, timed_out=True)
        return ExecResult(done.output.text(), done.returncode)

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        root, parts = self._beneath(path)
        data = confined.read(root, parts, MAX_FILE_BYTES + 1 if limit is None else limit)
        if limit is None and len(data) > MAX_FILE_BYTES:
            raise OSError(f"{path} is over the {MAX_FILE_BYTES} byte limit")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        root, parts = self._beneath(path)
        confined.write(root, parts, data)

    def confine(self, path: str) -> str:
        """The path, if it is a directory or file the file tools may search; PermissionError if not."""
        root, parts = self._beneath(path)
        if parts:
            confined.check_dir(root, parts[:-1])
        return path

    def _beneath(self, path: str) -> tuple[str, list[str]]:
        if self._tmp is None and self._cwd is None and not posixpath.isabs(path):
            self._made()  # a relative path is the directory's; an absolute one cannot lie in one not yet made
        full = posixpath.normpath(posixpath.join(self._cwd or self._tmp or "/", path))
        for root in self._roots:
            parts = confined.parts_beneath(root, full)
            if parts is not None:
                return root, parts
        dirs = [d for d in (self._cwd, self._tmp) if d]
        where = " and ".join(dirs) or "the prompt's own directory"
        raise confined.OutsideRefused(
            f"{path}: the local sandbox's file tools read and write only inside {where}; "
            "use a path there (the terminal runs as your user, but the file tools do not leave the prompt's directory)"
        )

    def cleanup(self) -> None:
        if self._tmp is not None:
            sandbox_dirs.remove(self._tmp)


def _roots(*dirs: str | None) -> list[str]:
    """The directories (as given and resolved) the file tools may use, longest first."""
    roots = {r for d in dirs if d for r in (d, os.path.realpath(d))}
    return sorted(roots, key=len, reverse=True)


def prepare(spec: SandboxSpec) -> None:
    if spec.cwd and not os.path.isdir(spec.cwd):
        raise SandboxError(f"cwd {spec.cwd!r} is not a directory on this machine")


def create(spec: SandboxSpec) -> LocalSandbox:
    return LocalSandbox(spec.cwd, spec.settings.local_containment)


def reap(labels: dict[str, str]) -> int:
    """Remove the sandboxes whose worker died (of any run of this user): their processes, cgroups and directories."""
    dead = sandbox_dirs.dead_leftovers()
    names = {os.path.basename(p) for p in dead}
    for cgroup in containment.cgroups_named({n + "." for n in names}):
        containment.kill_cgroup(cgroup)
    containment.kill_tagged(names)
    for path in dead:
        sandbox_dirs.remove(path)
    return len(dead)
