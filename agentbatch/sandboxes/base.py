"""The sandbox interfaces (what a tool gets, what a backend implements) and the data that crosses them.

docs/sandboxes.md is their reference: `Sandbox` and `Process` are what tools (and MCP servers) rely on,
`Backend` is what a new kind of sandbox implements and registers (registry.py).
"""

from __future__ import annotations

import abc
import hashlib
import os
import time
from collections.abc import Callable
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
    """The sandbox went away under a running sample (its container removed): the sample fails, whatever it ran."""


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
class Egress:
    """Where a sandbox's processes may connect, enforced from outside the sandbox (docker: firewall rules in the
    container's network namespace, which nothing in it can change): only `allowed` (host names, IPv4 and IPv6
    addresses, CIDR ranges; () nothing but the sandbox itself and its own services), or anywhere (None) in a sandbox
    whose egress is controlled and may be narrowed later (`set_egress`)."""

    allowed: tuple[str, ...] | None = ()


@dataclass(frozen=True)
class ComposeProject:
    """Several containers for one sample, a Docker Compose project (docs/sandboxes.md, "Several containers"): the
    sandbox is its `main` service, which the run's settings and the sample's resources apply to; the other services
    run beside it on a network of the sample's own, reachable by name, and go with it."""

    directory: str  # the project directory: relative paths in the files are from it
    files: tuple[str, ...]  # the Compose files, in order (a later one overrides an earlier one)
    env: tuple[tuple[str, str], ...] = ()  # the variables the files are interpolated with (none of the runner's)
    built: tuple[tuple[str, str], ...] = ()  # (service, image tag) of the services built before any sample
    timeout: float = 600.0  # seconds its services may take to start and become healthy (and its builds, each)
    name: str = ""  # what log lines call it
    labels: tuple[tuple[str, str], ...] = ()  # on the images it builds, beside the run directory's


@dataclass(frozen=True)
class Resources:
    """A sample's own sandbox resources (a Harbor task's); None leaves the run's flag in force."""

    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None  # applied where the engine's storage driver can (docs/harbor.md)
    network: bool | None = None  # False: no network, whatever --sandbox_network says
    env: tuple[tuple[str, str], ...] = ()  # variables of the container, over the image's
    user: str | None = None  # whom its commands (and long-lived processes) run as; None: the image's user
    egress: Egress | None = None  # where its processes may connect; None: wherever its network reaches
    own_network: bool = False  # on a network of its own, made with it and removed with it (not the engine's bridge)
    compose: ComposeProject | None = None  # the sandbox is this project's `main` service


@dataclass(frozen=True)
class ImageBuild:
    """An image made from a build context before any sample starts (a Dockerfile's directory, for docker).

    Its reference is `tag(base_ids)`: the repository, tagged by a hash of the context's files and of the ids of the
    images it is built from, so it is built once, reused by every later run, and built anew when either changes.
    """

    context: str  # the build context: a directory (its Dockerfile at the top)
    repository: str  # the image's name without a tag, e.g. "br-harbor/count-errors"
    context_hash: str  # a hash of every file of the context (path, content, executable bit), made by its format
    name: str = ""  # what log lines call it (a task's name)
    timeout: float = 600.0  # seconds the build may take (the runner scales it by --timeout_multiplier)
    labels: tuple[tuple[str, str], ...] = ()  # on the image, beside the run directory's (RUN_DIR_LABEL)

    def tag(self, base_ids: tuple[str, ...] = ()) -> str:
        """The image's reference, once the ids of its base images are known (without them: the context's alone)."""
        key = self.context_hash
        if base_ids:
            key = hashlib.sha256("\0".join((key, *base_ids)).encode()).hexdigest()
        return f"{self.repository}:{key[:20]}"


@dataclass
class Prepared:
    """What a backend's `prepare_all` made of one spec: the image its samples run in, and why not if it failed."""

    image: str | None = None  # the reference the samples use (a build's tag, once its base images are known)
    image_id: str | None = None  # the engine's id of that image, when known now
    built: bool = False  # built now (not found already)
    error: str | None = None  # why its samples cannot run: they fail at once, before any model call
    base_ids: tuple[str, ...] = ()  # a build's base images' ids, as its tag holds them
    seconds: float = 0.0


@dataclass
class SandboxSpec:
    """Where one sample runs: the run's settings plus the row's own image (or build), working directory, resources."""

    settings: SandboxSettings = field(default_factory=SandboxSettings)
    image: str | None = None
    cwd: str | None = None
    run_name: str = "run"
    labels: dict[str, str] = field(default_factory=dict)
    resources: Resources | None = None
    # The image to make before any sample (Backend.prepare_all); its samples then run in its tag, as `image`.
    build: ImageBuild | None = None

    @property
    def kind(self) -> str:
        """Its backend, as the run's choice says for a row with an image (or a build) and for one without."""
        return self.settings.image_kind if self.image or self.build else self.settings.kind


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

    One instance per process (registry.get). In order: `prepare_run` once per session in the runner, then
    `prepare_all` there for the images and builds the run's entries name, `prepare` for each sample before any
    model call, `create` when a sample first needs its sandbox (or, for a backend that `warms`, beside its first
    model call, then `warm`),
    `cleanup` when the sample ends, whatever happened; `reap` in the parent for what dead sessions left.
    """

    name = ""  # set by the registration
    takes_images = False  # whether a row's image can run in it (else such rows run in docker)
    warms = False  # whether `warm` starts anything: only then is a sandbox made before its sample first uses it
    # Whether `create` waits for a start permit (--sandbox_starts, sandboxes/starts.py): a container's creation is
    # heavy enough to pace; a backend whose `create` only makes directories says False.
    paced = True

    def prepare_run(self, settings: SandboxSettings) -> str:
        """Once per session, in the runner: check this backend works here (SandboxError if not); the line it prints."""
        return f"sandbox: {self.name}"

    def prepare_all(self, specs: list[SandboxSpec], parallel: int, log: Callable[[str], None]) -> list[Prepared]:
        """Once per session, in the runner, before any sample starts: make what the specs need that takes long (an
        image from its build context), up to `parallel` at once; per spec, in order, what was made or why not.

        Never raises for one spec: its `Prepared.error` fails its samples before any model call. The default makes
        nothing: an image is the spec's own, and a build is refused.
        """
        return [
            Prepared(error=f"the {self.name} backend builds no images") if s.build else Prepared(image=s.image)
            for s in specs
        ]

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

    def warm(self, sandbox: Sandbox) -> bool:
        """Start, without waiting for it, what the sandbox's first command needs; whether anything started. Never
        raises: what cannot start says why at the first command.

        Called beside a sample's first model call while this worker's samples have been running commands
        (sandboxes/early.py), so that the start is paid while the model thinks. The default starts nothing.
        """
        return False

    def ran_commands(self, sandbox: Sandbox) -> bool | None:
        """Whether the sample ran a command in the sandbox (what early.py learns from); None: not known."""
        return None

    def reap(self, labels: dict[str, str]) -> int:
        """In the runner: remove what dead sessions left (sandboxes carrying these labels); how many."""
        return 0

    def save_state(self, sandbox: Sandbox, out: BinaryIO, limit: int) -> dict:
        """The sandbox's files as its sample left them, written to `out` as a gzip-compressed tar of at most `limit`
        bytes (--keep_final_state); returns what restoring them needs besides (JSON: paths deleted, say).
        SandboxError if they cannot be kept.

        The default keeps the work directory, archived by the sandbox's own `tar` through `start` (any backend
        whose sandboxes start empty); a backend whose sandboxes start from an image keeps what changed in it.
        """
        process = sandbox.start(["tar", "-czf", "-", "."])
        try:
            written = 0
            while chunk := process.stdout.read(STATE_CHUNK):
                written += len(chunk)
                if written > limit:
                    raise SandboxError(f"the work directory is over {limit} bytes compressed")
                out.write(chunk)
            code = _ended(process)
        finally:
            process.kill()
        if code not in (0, 1):  # 1: a file changed while it was read (a process the agent left), kept as read
            raise SandboxError(f"tar could not archive the work directory (exit {code}): {one_line(process.stderr())}")
        return {}

    def restore_state(self, sandbox: Sandbox, files: BinaryIO, notes: dict) -> None:
        """Put what `save_state` kept into a fresh sandbox of the same spec (`notes`: what it returned); SandboxError
        if it cannot. The default unpacks it into the work directory with the sandbox's own `tar`."""
        process = sandbox.start(["tar", "-xzf", "-"])
        try:
            try:
                while chunk := files.read(STATE_CHUNK):
                    process.stdin.write(chunk)
                process.stdin.close()
            except (BrokenPipeError, ValueError):  # tar stopped reading: its exit code says why
                pass
            process.stdout.read()
            code = _ended(process)
        finally:
            process.kill()
        if code != 0:
            raise SandboxError(f"tar could not unpack the kept state (exit {code}): {one_line(process.stderr())}")

    def reaped(self, n: int, whose: str) -> str:
        """The line a session prints after `reap` removed n sandboxes (`whose`: "left by an earlier session of X")."""
        return f"removed {n} {self.name} sandboxes {whose}"


STATE_CHUNK = 1 << 20


def _ended(process: Process, seconds: float = 30.0) -> int | None:
    """A process's exit code once its output has ended (it may take a moment to be reaped); None if it never does."""
    deadline = time.monotonic() + seconds
    while (code := process.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return code


def owner_labels(run_dir: str, session: str) -> dict[str, str]:
    """The labels of one session's sandboxes: its run directory (absolute, symlinks resolved) and its id."""
    return {RUN_DIR_LABEL: os.path.realpath(run_dir), SESSION_LABEL: session}


def one_line(text: str, limit: int = 500) -> str:
    """Text (an engine's or a shell's message) as one line of at most `limit` characters."""
    return " ".join(text.split())[:limit]
