"""The local backend: a fresh temporary directory on this machine (or the row's cwd, used as given).

Not an isolation boundary: commands run as the runner's user and can reach what it can. What it does
guarantee: nothing a command starts outlives the command (containment.py), its output is kept in bounded
memory, and the file tools read and write only inside the sample's directories, without following
symbolic links, through no hard link and into no FIFO or device (confined.py).

Where a PID namespace contains the commands (the pidns method), the sample's first command starts its
resident shell as PID 1 of one (resident.py), and every command is a fork of it; the other methods start
every command in its own containment.
"""

from __future__ import annotations

import functools
import itertools
import os
import posixpath
import shlex
import subprocess

from agentbatch.sandboxes import confined, containment, registry, sandbox_dirs
from agentbatch.sandboxes.base import (
    MAX_FILE_BYTES,
    SANDBOX_ENV,
    ExecResult,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
)
from agentbatch.sandboxes.output import stream
from agentbatch.sandboxes.process import PipeProcess, on_lasting_thread
from agentbatch.sandboxes.resident import ResidentShell, SampleShell, ShellStart, WarmsItsShell
from agentbatch.sandboxes.shell_program import hold_host_names, locale_given_back, release_host_names

UNTRUSTED = "not an isolation boundary: commands run as your user and reach whatever it can"
_METHODS = {"pidns": "a PID namespace", "cgroup": "a cgroup", "scan": "a /proc scan (weak)"}


class LocalSandbox:
    """A fresh temporary directory on this machine (or the row's cwd, used as given)."""

    def __init__(self, cwd: str | None = None, containment_method: str | None = None):
        if cwd and not os.path.isdir(cwd):
            raise SandboxError(f"cwd {cwd!r} is not a directory on this machine")
        self._cwd = cwd
        self.method = containment_method or containment.best()
        self._count = itertools.count()
        # Made when first needed (a command, a relative path), not for every prompt: creating and removing a
        # directory per sample queued 1,024 samples on the file system (bench/RESULTS.md).
        self._tmp: str | None = None
        self._roots = _roots(cwd)
        self._processes: list[PipeProcess] = []
        self._shell = SampleShell(self, LocalSandbox._resident_shell)
        self._names: str | None = None  # the names directory its resident shells read commands through

    def _resident_shell(self) -> ResidentShell:
        if self._names is None:  # held until the sandbox's clean-up
            self._names = hold_host_names()
        return ResidentShell(functools.partial(_namespace_prefix, self._env), self._env, self.workdir, self._names)

    @property
    def workdir(self) -> str:
        return self._cwd or self._made()

    def _made(self) -> str:
        """The prompt's temporary directory (HOME and TMPDIR of its commands), made on first use."""
        if self._tmp is None:
            self._tmp = sandbox_dirs.make()
            self._name = os.path.basename(self._tmp)
            self._env = dict(SANDBOX_ENV, HOME=self._tmp, TMPDIR=self._tmp, PWD=self.workdir)
            if self.method == "scan":
                self._env[containment.TAG_VAR] = self._name
            # The file tools' roots: a path the model gives must lie below one of them (as given or resolved).
            self._roots = _roots(self._cwd, self._tmp)
        return self._tmp

    def _contained(self, command: str, tag: str, cgroup_name: str) -> containment.Command:
        cgroup = None
        if self.method == "cgroup":
            try:
                cgroup = containment.new_cgroup(cgroup_name)
            except OSError as e:
                raise SandboxError(f"cannot make the command's cgroup: {e}") from e
        return containment.Command(self.method, command, tag, cgroup)

    def warm(self) -> bool:
        """Start the resident shell now, without waiting for it (early.py); whether one started."""
        if self.method != "pidns":
            return False
        self._made()
        return self._shell.launch()

    @property
    def ran_commands(self) -> bool | None:
        """Whether a command asked for the resident shell; None where the method has none."""
        return self._shell.used if self.method == "pidns" else None

    def exec(self, command: str, timeout: float) -> ExecResult:
        self._made()
        done = self._shell.run(command, timeout) if self.method == "pidns" else None
        return done if done is not None else self._exec_apart(command, timeout)

    def _exec_apart(self, command: str, timeout: float) -> ExecResult:
        """A command in a containment of its own (the method has no resident shell, or it is busy)."""
        self._made()
        contained = self._contained(command, self._name, f"{self._name}.{next(self._count)}")
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

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> PipeProcess:
        """A process contained as a command is, under a tag and cgroup of its own: commands' ends leave it running."""
        if not argv:
            raise SandboxError("no command to start")
        self._made()
        # Names below the sandbox's, so the end of a command leaves it alone and a reap of the sandbox finds it.
        n = next(self._count)
        contained = self._contained("exec " + shlex.join(argv), f"{self._name}/p{n}", f"{self._name}.p{n}")
        environment = {**self._env, **(env or {})}
        if self.method == "scan":
            environment[containment.TAG_VAR] = contained.tag

        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                contained.argv,
                cwd=self.workdir,
                env=environment,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )

        try:
            process = PipeProcess(on_lasting_thread(popen), contained.kill)
        except OSError as e:
            contained.end()
            raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
        self._processes.append(process)
        return process

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
        """The path as checked, if no symlink leads there (itself included); PermissionError if not.

        What was checked is the path with `.` and `..` resolved on its text: the same path, normalized, is
        what a search gets, so `link/.` cannot lead through a symlink the check never saw.
        """
        root, parts = self._beneath(path)
        confined.check_start(root, parts)
        normal = posixpath.normpath(path)
        if posixpath.isabs(normal) or normal == ".." or normal.startswith("../"):
            return posixpath.join(root, *parts)  # `..` means what the kernel says on a path: give none
        return normal

    def _beneath(self, path: str) -> tuple[str, list[str]]:
        if self._tmp is None and self._cwd is None and not posixpath.isabs(path):
            self._made()  # a relative path is the directory's; an absolute one cannot lie in one not yet made
        full = posixpath.normpath(posixpath.join(self._cwd or self._tmp or "/", path))
        for root in self._roots:
            parts = confined.parts_beneath(root, full)
            if parts is not None:
                return root, parts
        dirs = [d for d in (self._cwd, self._tmp) if d]
        where = " and ".join(dirs) or "the sample's own directory"
        raise confined.OutsideRefused(
            f"{path}: the local sandbox's file tools read and write only inside {where}; "
            "use a path there (the terminal runs as your user, but the file tools do not leave the sample's directory)"
        )

    def cleanup(self) -> None:
        self._shell.close()
        if self._names is not None:
            self._names = None
            release_host_names()
        processes, self._processes = self._processes, []
        for process in processes:
            process.kill()
        if self._tmp is not None:
            sandbox_dirs.remove(self._tmp)


def _namespace_prefix(env: dict[str, str]) -> ShellStart:
    """setpriv and unshare start with LC_ALL=C, the shell's program gives the sandbox's own back first."""
    start_env, back = locale_given_back(env)
    return ShellStart(containment.namespace_prefix(), prelude=back, env=start_env)


def _roots(*dirs: str | None) -> list[str]:
    """The directories (as given and resolved) the file tools may use, longest first."""
    roots = {r for d in dirs if d for r in (d, os.path.realpath(d))}
    return sorted(roots, key=len, reverse=True)


@registry.backend("local")
class LocalBackend(WarmsItsShell, sandbox_dirs.WorkerDirBackend):
    """Commands run as the runner's user in a directory of this machine, contained but not isolated."""

    def prepare_run(self, settings: SandboxSettings, because: str = "") -> str:
        """`because`: why the preferred backend (bwrap) does not run here, when this one runs in its place."""
        reason = f" ({because})" if because else ""
        if not settings.network:
            raise SandboxError(
                f"--sandbox_network=none needs a sandbox that can cut the network, bwrap or docker{reason}"
            )
        method = _METHODS[settings.local_containment or containment.best()]
        other = "--sandbox=docker" if because else "--sandbox=bwrap or docker"
        return (
            f"warning: sandbox: local{reason}, {UNTRUSTED}; each command's processes are contained by {method}; "
            f"use {other} for models you do not trust"
        )

    def prepare(self, spec: SandboxSpec) -> None:
        if spec.cwd and not os.path.isdir(spec.cwd):
            raise SandboxError(f"cwd {spec.cwd!r} is not a directory on this machine")

    def create(self, spec: SandboxSpec) -> LocalSandbox:
        return LocalSandbox(spec.cwd, spec.settings.local_containment)
