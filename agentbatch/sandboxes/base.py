"""The sandbox interfaces (what a tool gets, what a backend implements) and the data that crosses them.

docs/sandboxes.md is their reference: `Sandbox` and `Process` are what tools (and MCP servers) rely on,
`Backend` is what a new kind of sandbox implements and registers (registry.py).
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

# Labels of every sandbox that carries labels (a container): which run directory and which session made it.
# A session holds its run directory's lock (run_dir/lock.py) while it runs, so once a session has
# the lock, every sandbox of that directory but its own is a dead session's, and may be removed.
RUN_DIR_LABEL = "batch_runner.run_dir"
SESSION_LABEL = "batch_runner.session"
RUN_LABEL = "batch_runner.run"  # the run's name, for people: `docker ps --filter label=batch_runner.run=NAME`

# Only these variables reach a sandboxed command (on top of what the backend itself sets, HOME say);
# everything of the runner's environment (API keys above all) stays out.
SANDBOX_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
}
MAX_FILE_BYTES = 64 * 1024 * 1024  # the largest file read_file returns whole (limit=None)


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

    kind: str = "local"  # the backend of a sample whose row has no image (choice.choose sets it)
    image_kind: str = "docker"  # the backend of a sample whose row names an image (choice.choose sets it)
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

    def kinds(self, images: bool) -> set[str]:
        """The backends a run uses: its own, and that of rows with an image if it has any."""
        return {self.kind, self.image_kind} if images else {self.kind}


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
    """Where one sample runs: the run's settings plus the row's own image, working directory and resources."""

    settings: SandboxSettings = field(default_factory=SandboxSettings)
    image: str | None = None
    cwd: str | None = None
    run_name: str = "run"
    labels: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None

    @property
    def kind(self) -> str:
        """Its backend, as the run's choice says for a row with an image and for one without."""
        return self.settings.image_kind if self.image else self.settings.kind


class Process(Protocol):
    """A long-lived process in a sample's sandbox (Sandbox.start): bytes in on stdin, bytes out on stdout.

    Its stdout is a blocking binary file (read it from a thread of its own); b"" means it ended or closed
    it. Its stderr is kept in bounded memory, head and tail. It ends with its sandbox at the latest.
    """

    stdin: BinaryIO
    stdout: BinaryIO

    def stderr(self) -> str:
        """What it printed on stderr so far: the first and last MAX_KEPT_OUTPUT bytes, the cut marked."""

    def poll(self) -> int | None:
        """Its exit code once it has ended, else None."""

    def kill(self) -> None:
        """End it and everything it started, and close its pipes; safe to call twice."""


class Sandbox(Protocol):
    """A sample's environment: tools act only through it. Paths are the sandbox's, relative ones from workdir."""

    workdir: str

    def exec(self, command: str, timeout: float) -> ExecResult:
        """Run a shell command in workdir; past `timeout` seconds it is killed with everything it started."""

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """A regular file's bytes: at most `limit` of them, else all up to MAX_FILE_BYTES (OSError past it)."""

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a regular file, making its missing parent directories."""

    def confine(self, path: str) -> str:
        """The path to give a command (a search) that must reach no further than the file tools; raises if not."""

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> Process:
        """Start a long-lived process in workdir (argv[0] looked up on the sandbox's PATH), `env` added to its
        environment; SandboxError if it cannot start. It ends when killed, or with the sandbox."""


class Backend(abc.ABC):
    """A kind of sandbox, registered with `@registry.backend("name")`: it owns the whole life of its sandboxes.

    One instance per process (registry.get). In order: `prepare_run` once per session in the runner,
    `prepare` for each sample before any model call, `create` when a sample first needs its sandbox,
    `cleanup` when the sample ends, whatever happened; `reap` in the parent for what dead sessions left.
    """

    name = ""  # set by the registration
    takes_images = False  # whether a row's image can run in it (else such rows run in docker)

    def prepare_run(self, settings: SandboxSettings) -> str:
        """Once per session, in the runner: check this backend works here (SandboxError if not); the line it prints."""
        return f"sandbox: {self.name}"

    def prepare(self, spec: SandboxSpec) -> None:  # noqa: B027 (nothing to check is a fine default)
        """Before a sample's first model call: check its sandbox can be made (its image is here); SandboxError if not."""

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox:
        """Make the sample's sandbox; SandboxError if the environment fails. `cleanup` follows, whatever happens."""

    @abc.abstractmethod
    def cleanup(self, sandbox: Sandbox, interrupted: bool) -> None:
        """Remove the sandbox and everything running in it; never raises, safe to call twice.

        `interrupted`: the sample did not run to its end (an error, a lost sandbox, a stopping worker).
        """

    def reap(self, labels: dict[str, str]) -> int:
        """In the runner: remove what dead sessions left (sandboxes carrying these labels); how many."""
        return 0

    def reaped(self, n: int, whose: str) -> str:
        """The line a session prints after `reap` removed n sandboxes (`whose`: "left by an earlier session of X")."""
        return f"removed {n} {self.name} sandboxes {whose}"


def owner_labels(run_dir: str, session: str) -> dict[str, str]:
    """The labels of one session's sandboxes: its run directory (absolute, symlinks resolved) and its id."""
    return {RUN_DIR_LABEL: os.path.realpath(run_dir), SESSION_LABEL: session}


def one_line(text: str, limit: int = 500) -> str:
    """Text (an engine's or a shell's message) as one line of at most `limit` characters."""
    return " ".join(text.split())[:limit]
