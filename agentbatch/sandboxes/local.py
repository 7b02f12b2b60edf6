"""The local backend: a fresh temporary directory on this machine (or the row's cwd, used as given)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import uuid

from agentbatch.sandboxes.base import SAFE_ENV, ExecResult, SandboxError, SandboxSpec, resolve_path

TAG_VAR = "BR_SANDBOX_ID"


class LocalSandbox:
    """A fresh temporary directory on this machine (or the row's cwd, used as given)."""

    def __init__(self, cwd: str | None = None):
        if cwd and not os.path.isdir(cwd):
            raise SandboxError(f"cwd {cwd!r} is not a directory on this machine")
        self._cwd = cwd
        # Made when first needed (a command, a written file, a relative path), not for every prompt: creating
        # and removing a directory per prompt queued 1,024 sessions on the file system (bench/RESULTS.md).
        self._tmp: str | None = None
        # The tag follows every process the prompt starts, even one that left the process group (setsid).
        self._tag = f"{TAG_VAR}={uuid.uuid4().hex}".encode()
        self._ran = False  # no command, nothing to hunt for in /proc at cleanup

    @property
    def tmp(self) -> str:
        """The prompt's own directory (its HOME and TMPDIR, and its working directory without a cwd)."""
        if self._tmp is None:
            self._tmp = tempfile.mkdtemp(prefix="br-sandbox-")
        return self._tmp

    @property
    def workdir(self) -> str:
        return self._cwd or self.tmp

    @property
    def _env(self) -> dict[str, str]:
        env = dict(SAFE_ENV, HOME=self.tmp, TMPDIR=self.tmp, PWD=self.workdir)
        env[TAG_VAR] = self._tag.split(b"=", 1)[1].decode()
        return env

    def exec(self, command: str, timeout: float) -> ExecResult:
        # A new session lets a timeout kill the whole process group, not just the shell.
        self._ran = True
        proc = subprocess.Popen(
            ["/bin/bash", "-c", command],
            cwd=self.workdir,
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout)
            return ExecResult(out.decode("utf-8", "replace"), proc.returncode)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _kill_tagged(self._tag)
            try:
                out, _ = proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a process that shed the tag still holds the pipe
                proc.kill()
                proc.stdout.close()
                proc.wait()
                out = b""
            return ExecResult(out.decode("utf-8", "replace"), -9, timed_out=True)

    def read_file(self, path: str) -> bytes:
        with open(path if os.path.isabs(path) else resolve_path(self.workdir, path), "rb") as f:
            return f.read()

    def write_file(self, path: str, data: bytes) -> None:
        full = os.path.realpath(resolve_path(self.workdir, path))
        # The file tools may write only inside the prompt's own directories, never elsewhere on the host.
        roots = {os.path.realpath(self.workdir), os.path.realpath(self.tmp)}
        if not any(full == r or full.startswith(r + os.sep) for r in roots):
            raise PermissionError(f"{path}: the local sandbox writes only inside its working directory {self.workdir}")
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)

    def cleanup(self) -> None:
        if self._ran:
            _kill_tagged(self._tag)  # background processes the prompt left behind
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_tagged(tag: bytes) -> None:
    """SIGKILL every process whose environment carries this sandbox's tag (Linux /proc; no-op elsewhere)."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                tagged = tag in f.read().split(b"\0")
            if tagged:
                os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass  # gone, or not ours to read


def prepare(spec: SandboxSpec) -> None:
    if spec.cwd and not os.path.isdir(spec.cwd):
        raise SandboxError(f"cwd {spec.cwd!r} is not a directory on this machine")


def create(spec: SandboxSpec) -> LocalSandbox:
    return LocalSandbox(spec.cwd)


def reap(labels: dict[str, str]) -> int:
    """Nothing to do: each prompt's processes and directory go with its cleanup."""
    return 0
