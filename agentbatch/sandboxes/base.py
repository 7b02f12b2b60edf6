"""The sandbox interface every backend implements, and the data that crosses it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

# Labels of every sandbox that carries labels (a container): which run directory and which session made it.
# A session holds its run directory's lock (run_files.RunFiles.lock) while it runs, so once a session has
# the lock, every sandbox of that directory but its own is a dead session's, and may be removed.
RUN_DIR_LABEL = "batch_runner.run_dir"
SESSION_LABEL = "batch_runner.session"

# Only these host variables reach a sandboxed command; everything else (API keys above all) stays out.
SAFE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
}


class SandboxError(Exception):
    """The environment itself failed (not the command the model ran)."""


class SandboxLost(SandboxError):
    """The sandbox went away under a running prompt (its container removed): the prompt fails, whatever it ran."""


@dataclass
class ExecResult:
    """What a command printed (stdout and stderr interleaved), its exit code, and whether it timed out."""

    output: str
    exit_code: int
    timed_out: bool = False


@dataclass(frozen=True)
class SandboxSettings:
    """The run's sandbox choice and limits (from the flags): docker's, then bwrap's rlimits of each command."""

    kind: str = "local"
    docker_image: str | None = None
    memory: str = "1g"
    cpus: float = 1.0
    pids: int = 256
    network: bool = True
    starts: int = 0  # sandboxes this process creates at once (0: no limit); see sandboxes/starts.py
    processes: int = 256
    memory_bytes: int = 1024**3
    file_size_bytes: int = 1024**3
    cpu_seconds: int = 600
    local_containment: str | None = None  # None: the best this machine allows (tests name one)


@dataclass(frozen=True)
class Resources:
    """A sample's own container resources (a Harbor task's); None leaves the run's flag in force."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None  # applied where the engine's storage driver can (docs/harbor.md)
    network: bool | None = None  # False: no network, whatever --sandbox_network says
    env: tuple[tuple[str, str], ...] = ()  # variables of the container, over the image's


@dataclass
class SandboxSpec:
    """Where one prompt runs: the run's settings plus the row's own image, working directory and resources."""

    settings: SandboxSettings = field(default_factory=SandboxSettings)
    image: str | None = None
    cwd: str | None = None
    run_name: str = "run"
    labels: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None

    @property
    def kind(self) -> str:
        """The backend: a row with an image runs in Docker whatever the run's default."""
        return "docker" if self.image else self.settings.kind


class Sandbox(Protocol):
    """A prompt's environment; tools act only through it."""

    workdir: str

    def exec(self, command: str, timeout: float) -> ExecResult: ...

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """A regular file's bytes: at most `limit` of them, else all up to the backend's maximum (OSError past it)."""

    def write_file(self, path: str, data: bytes) -> None: ...

    def confine(self, path: str) -> str:
        """The path to give a command (a search) that must reach no further than the file tools; raises if not."""

    def cleanup(self) -> None: ...


class Backend(Protocol):
    """A kind of sandbox: a module with these three functions, listed in `agentbatch.sandboxes.BACKENDS`."""

    def prepare(self, spec: SandboxSpec) -> None:
        """Check, before any model call, that the sandbox can be made (image present); raise SandboxError if not."""

    def create(self, spec: SandboxSpec) -> Sandbox:
        """Make the sandbox; the caller must call its cleanup() whatever happens."""

    def reap(self, labels: dict[str, str]) -> int:
        """Remove every sandbox carrying all these labels (what a dead session left behind); returns how many."""


def resolve_path(workdir: str, path: str) -> str:
    """A path as the model gave it, relative paths taken from the working directory."""
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(workdir, path))


def owner_labels(run_dir: str, session: str) -> dict[str, str]:
    """The labels of one session's sandboxes: its run directory (absolute, symlinks resolved) and its id."""
    return {RUN_DIR_LABEL: os.path.realpath(run_dir), SESSION_LABEL: session}
