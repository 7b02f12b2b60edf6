"""The docker backend's sandbox: one labelled container per sample, driven through the docker SDK.

A container runs an idle shell loop as PID 1; every command is `sh -c` (bash when the image has it) in the
working directory, started by the container's resident shell (docker_resident.py: one `docker exec` for all
the sample's commands) or by an exec of its own, with a deadline enforced from the host. Files move through the
archive API (docker_files.py), so reading and writing work in images that hold no tools at all. The working
directory is the row's `cwd`, else the image's WORKDIR, else /workspace; Docker creates it if absent.

Every exec carries a tag of its own in its environment (TAG_VAR). At a command's timeout, or when a
long-lived process is killed, everything it started goes: what carries its tag (a `setsid` or `nohup`
process, a double fork), what is in its session, what descends from either, and what was orphaned since
it started without any tag (a process that cleared its environment). Other execs' processes stay.

A process the commands must not read (an MCP server given secrets) runs in a container of its own beside
the sample's, on its network (start_apart): in one container, the image's user reads every process.

A sample's resources may name the user its commands run as (else the image's), a network of the container's
own, and an egress policy: the container is then made without NET_RAW and its egress set (docker_network.py,
docker_egress.py) before anything runs in it; `set_egress` changes it later. A Compose project's `main` container, made by
Compose, is driven the same way (`attach`, compose.py).
"""

from __future__ import annotations

import re
import time
import uuid

import docker.errors

from agentbatch.sandboxes import docker_files, docker_network
from agentbatch.sandboxes.base import (
    RUN_LABEL,
    SANDBOX_ENV,
    ExecResult,
    Resources,
    SandboxError,
    SandboxLost,
    SandboxSpec,
)
from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message, remove, remove_network
from agentbatch.sandboxes.docker_resident import ContainerShell
from agentbatch.sandboxes.docker_stream import ExecProcess, close, pump
from agentbatch.sandboxes.output import KILL_GRACE, BoundedOutput

DEFAULT_WORKDIR = "/workspace"
# PID 1 must outlive every command yet exit on SIGTERM; only sh and sleep are assumed in the image.
KEEPALIVE = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
PROBE = "command -v bash 2>/dev/null || echo; id -u 2>/dev/null || echo 0; id -g 2>/dev/null || echo 0"
# Of SANDBOX_ENV, what a container gets where its image sets none: LC_ALL and TERM name a locale and a
# terminal the image may lack (bash and perl warn at every start about a missing LC_ALL locale).
IMAGE_ENV = ("PATH", "LANG")
TAG_VAR = "BR_EXEC_ID"
_storage_refused: list[str] = []  # the engine said once that it cannot limit a container's disk: not asked again
# Kills what one exec started ($1 its tag, $2 its shell's PID if known) with shell builtins and /proc only.
# In /proc/N/stat the fields after ") " are: state ppid pgrp session ..., the 20th the start time. NUL
# bytes of /proc/N/environ vanish in `read`, so a process's environment is read as one string.
KILL = r"""[ -n "$1" ] || exit 0
tag="BR_EXEC_ID=$1"; shell=$2; me=$$; since=""
if [ -n "$shell" ]; then
  if read -r l 2>/dev/null < "/proc/$shell/stat"; then set -- ${l##*") "}; since=${20}; fi
  kill -9 -"$shell" 2>/dev/null
fi
pass=0
while [ "$pass" -lt 20 ]; do
  pass=$((pass + 1)); hit=" "; all=""
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = "$me" ] && continue
    read -r l 2>/dev/null < "$d/stat" || continue
    set -- ${l##*") "}
    case $1 in Z|X) continue;; esac
    all="$all $p:$2"
    env=""
    while read -r e || [ -n "$e" ]; do env="$env$e"; done 2>/dev/null < "$d/environ"
    case "$env" in
      *"$tag"*) hit="$hit$p ";;
      *BR_EXEC_ID=*) ;;
      *) if [ "$2" = 1 ] && [ -n "$since" ] && [ "${20}" -ge "$since" ]; then hit="$hit$p "; fi;;
    esac
    if [ -n "$shell" ] && [ "$4" = "$shell" ]; then hit="$hit$p "; fi
  done
  grown=1
  while [ -n "$grown" ]; do
    grown=""
    for e in $all; do
      case "$hit" in *" ${e%%:*} "*) continue;; esac
      case "$hit" in *" ${e#*:} "*) hit="$hit${e%%:*} "; grown=1;; esac
    done
  done
  [ "$hit" = " " ] && break
  kill -9 $hit 2>/dev/null
done
true"""
# A forced removal kills the command before the engine marks its container gone: how long a SIGKILLed
# command waits for that mark before it counts as killed by something inside the container (OOM, say).
LOST_SETTLE = 5.0


def _new_tag() -> str:
    return uuid.uuid4().hex[:16]


def _script(command: str) -> str:
    """What the command's shell runs: its PID first (a session leader's, so a timeout can kill what it started)."""
    return 'echo "$$"; exec 2>&1\n' + command


def container_name(run_name: str) -> str:
    """A unique, Docker-valid container name that shows which run made it."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_name).strip("-.")[:40] or "run"
    return f"br-{safe}-{uuid.uuid4().hex[:10]}"


def _limits(spec: SandboxSpec) -> tuple[dict, bool]:
    """The container's limits and whether it has a network: the run's flags, the sample's own resources over them."""
    s, r = spec.settings, spec.resources or Resources()
    limits: dict = {}
    memory = f"{r.memory_mb}m" if r.memory_mb else s.memory
    if memory:
        limits.update(mem_limit=memory, memswap_limit=memory)  # no swap beyond the limit
    cpus = r.cpus or s.cpus
    if cpus:
        limits["nano_cpus"] = int(cpus * 1e9)
    if s.pids:
        limits["pids_limit"] = int(s.pids)
    if r.storage_mb:
        limits["storage_opt"] = {"size": f"{int(r.storage_mb)}M"}
    return limits, s.network and r.network is not False


class DockerSandbox:
    """One container for one sample; started when constructed, force-removed by cleanup().

    `beside`: this container is one of its own for a process of that sample's that must be private
    (start_apart): same image, limits and working directory, on that sample's network (its localhost too).
    """

    def __init__(self, spec: SandboxSpec, beside: DockerSandbox | None = None, attach: str | None = None):
        engine = client()
        self.spec = spec
        self.image = image = spec.image or spec.settings.docker_image
        self.container_id: str | None = None
        self._processes: list[ExecProcess] = []
        self._resident = ContainerShell(self)
        self._beside = beside
        self._network: str | None = None  # the network of its own (Resources.own_network), removed with it
        resources = spec.resources or Resources()
        self.user = resources.user or ""  # whom commands run as ("": the image's user)
        try:
            config = engine.images.get(image).attrs.get("Config") or {}
        except ENGINE_ERRORS as e:
            raise SandboxError(f"cannot inspect Docker image {image!r}: {message(e)}") from e
        self.workdir = beside.workdir if beside else spec.cwd or config.get("WorkingDir") or DEFAULT_WORKDIR
        if attach is not None:  # a container made by someone else (Compose): driven, not created
            self.container_id = attach
            try:
                made = engine.api.inspect_container(attach).get("Config") or {}
            except ENGINE_ERRORS as e:
                raise SandboxError(f"cannot inspect container {attach[:12]}: {message(e)}") from e
            self.workdir = spec.cwd or made.get("WorkingDir") or "/"
            self._started(resources)
            return
        env = container_env(spec, config)
        labels = {**spec.labels, RUN_LABEL: spec.run_name}
        limits, network = _limits(spec)
        if resources.egress is not None:
            limits["cap_drop"] = ["NET_RAW"]  # a raw socket would go around the egress rules
        if network and resources.own_network and not beside:
            self._network = docker_network.own_network(container_name(spec.run_name), labels)
        network_mode = (
            f"container:{beside.container_id}" if beside else self._network or ("bridge" if network else "none")
        )
        create = dict(
            entrypoint=KEEPALIVE,
            command=[],
            name=container_name(spec.run_name),
            working_dir=self.workdir,
            environment=env,
            labels=labels,
            network_mode=network_mode,
            detach=True,
            stdin_open=False,
            tty=False,
        )
        try:
            if _storage_refused:
                limits.pop("storage_opt", None)
            try:
                container = engine.containers.create(image, **create, **limits)
            except docker.errors.APIError as e:
                # storage_opt size needs a driver that can enforce it (overlay2 on xfs with pquota, btrfs, zfs...)
                if "storage_opt" not in limits or "storage-opt" not in message(e).lower():
                    raise
                _storage_refused.append(message(e))
                limits.pop("storage_opt")
                container = engine.containers.create(image, **create, **limits)
        except ENGINE_ERRORS as e:
            self.cleanup()
            raise SandboxError(f"cannot create a container from {image!r}: {message(e)}") from e
        self.container_id = container.id
        try:
            container.start()
        except ENGINE_ERRORS as e:
            self.cleanup()
            raise SandboxError(f"cannot start a container from {image!r}: {message(e)}") from e
        self._started(resources)

    def _started(self, resources: Resources) -> None:
        """Once the container runs, before anything else runs in it: its egress set, its shell and user probed."""
        try:
            if resources.egress is not None and not self._beside:
                self.set_egress(resources.egress.allowed)
            self.shell, self._uid, self._gid = self._run_probe()
            if self._uid != 0:
                self._give_empty_workdir_to_user()
        except ENGINE_ERRORS as e:
            self.cleanup()
            raise SandboxError(f"cannot start a container from {self.image!r}: {message(e)}") from e
        except BaseException:
            self.cleanup()
            raise

    def set_egress(self, allowed: tuple[str, ...] | None) -> None:
        """Let the container's processes connect only to `allowed` (and its own services), or anywhere (None);
        SandboxError if that cannot be done (the sample fails: a policy is never left unenforced)."""
        docker_network.set_egress(self, allowed)

    def stop(self) -> None:
        """Stop the container at once (its processes killed), keeping it until cleanup; never raises."""
        docker_network.stop(self.container_id)

    def address_of(self, host: str) -> str | None:
        """The address `host` has in the sandbox's network (localhost: the container itself), or None: how the
        runner reaches a server of the sample's (an MCP URL)."""
        return docker_network.address_of(self, host)

    def _run_probe(self) -> tuple[str, int, int]:
        """Which shell the image offers and whose files we write (so a non-root user can edit them)."""
        result = self._exec(["sh", "-c", PROBE], timeout=30, user=self.user)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"image {self.image!r} cannot run sh in its container: {result.output.strip()[:300]}")
        lines = (result.output.splitlines() + ["", "0", "0"])[:3]
        ids = [int(x) if x.strip().isdigit() else 0 for x in lines[1:]]
        return lines[0].strip() or "sh", ids[0], ids[1]

    def _give_empty_workdir_to_user(self) -> None:
        """Docker creates a missing working directory as root; a non-root image user could not write there."""
        script = f'[ -z "$(ls -A "$1" 2>/dev/null)" ] && chown {self._uid}:{self._gid} "$1"; true'
        self._exec(["sh", "-c", script, "sh", self.workdir], timeout=30, user="0")

    def exec(self, command: str, timeout: float, user: str | None = None) -> ExecResult:
        """Run a shell command in the working directory, as the sandbox's user (or `user`: a name or uid, "" the
        image's); past the timeout it is killed with what it started.

        As the sandbox's user it runs in the container's resident shell (docker_resident.py, started as that
        user) when that is free, else in an exec of its own, as the same text, with the same tag; as another
        user always in an exec of its own.
        """
        done = None if user not in (None, self.user) else self._resident.run(_script(command), _new_tag(), timeout)
        return done if done is not None else self._exec_apart(command, timeout, user)

    def exec_alone(self, command: str, timeout: float, user: str | None = None) -> ExecResult:
        """A command in an exec of its own, the resident shell ended first: for one that kills every process of
        the container (the runner's own clean-up, harbor/container.py), which would kill that shell under it."""
        self._resident.end()
        return self._exec_apart(command, timeout, user)

    def _exec_apart(self, command: str, timeout: float, user: str | None = None) -> ExecResult:
        """A command in an exec of its own: as another user, or the resident shell busy or refused."""
        user = self.user if user is None else user
        return self._exec([self.shell, "-c", _script(command)], timeout, tag=_new_tag(), user=user)

    def _exec(self, cmd: list[str], timeout: float, tag: str | None = None, user: str = "") -> ExecResult:
        """Run cmd; with a tag, its first line is its PID, and at the timeout it goes with all it started."""
        exec_id, sock = self._start_exec(cmd, tag=tag, user=user)
        out = BoundedOutput()

        def deliver(_stream: int, data: bytes) -> None:  # stdout and stderr, interleaved as they came
            out.add(data)

        try:
            eof = pump(sock, time.monotonic() + max(float(timeout), 0.1), deliver)
            pid = out.take_first_line() if tag else None
            if not eof and tag:  # our own execs (the probe, a kill) are not killed: they start nothing
                self._kill(tag, pid)
                pump(sock, time.monotonic() + KILL_GRACE, deliver)
        finally:
            close(sock)
        if not eof:
            self._raise_if_lost()
            return ExecResult(out.text(), -9, timed_out=True)
        code = self._exit_code(exec_id)
        if code < 0 or code == 137:  # SIGKILLed: by its own doing, or because its container went away
            self._raise_if_lost(settle=LOST_SETTLE)
        return ExecResult(out.text(), code)

    def _start_exec(self, cmd: list[str], tag: str | None = None, user: str = "", stdin: bool = False, env=None):
        """The exec's id and its attached connection; `tag` goes into its environment (TAG_VAR)."""
        if not self.container_id:
            raise SandboxError("the sandbox was already cleaned up")
        api = client().api
        environment = {**(env or {}), TAG_VAR: tag} if tag else None
        try:
            exec_id = api.exec_create(
                self.container_id,
                cmd,
                stdout=True,
                stderr=True,
                stdin=stdin,
                tty=False,
                workdir=self.workdir,
                user=user,
                environment=environment,
            )["Id"]
            return exec_id, api.exec_start(exec_id, socket=True)
        except ENGINE_ERRORS as e:
            self._raise_if_lost(e)
            raise SandboxError(f"the sandbox container cannot run commands: {message(e)}") from e

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> ExecProcess:
        """A process in the container, an exec with stdin attached; it goes when killed or with the container."""
        if not argv:
            raise SandboxError("no command to start")
        tag = _new_tag()
        # Its PID first, on stderr, so that stdout carries nothing but what the process writes.
        exec_id, sock = self._start_exec(
            ["sh", "-c", 'echo "$$" >&2; exec "$@"', "sh", *argv], tag, user=self.user, stdin=True, env=env
        )
        # A container of its own is its process's alone: the process's end is the container's.
        end = (lambda _pid: self.cleanup()) if self._beside else (lambda pid: self._kill(tag, pid))
        process = ExecProcess(sock, lambda: self._exit_code(exec_id, wait=False), end)
        self._processes.append(process)
        return process

    def start_apart(self, argv: list[str], env: dict[str, str] | None = None) -> ExecProcess:
        """A process that no command of this sandbox can read (an MCP server's secrets in `env`): in a container
        of its own beside this one, removed when the process is killed or this sandbox goes.

        Every command here runs as the image's user, often root, who reads any process's /proc/N/environ in the
        container's one PID namespace; the other container shares its network, not its files.
        """
        if not self.container_id:
            raise SandboxError("the sandbox was already cleaned up")
        if self._beside is not None:
            return self.start(argv, env)
        apart = DockerSandbox(self.spec, beside=self)
        try:
            process = apart.start(argv, env)
        except BaseException:
            apart.cleanup()
            raise
        self._processes.append(process)  # its kill, at the latest at this sandbox's cleanup, removes its container
        return process

    def _exit_code(self, exec_id: str, wait: bool = True) -> int | None:
        """The exec's exit code (-1 if the engine has none); `wait`: for a moment, else None while it runs."""
        api = client().api
        # The stream can close a moment before the engine records the exit code.
        for _ in range(50 if wait else 1):
            try:
                info = api.exec_inspect(exec_id)
            except ENGINE_ERRORS:  # the exec went with its container
                return -1
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if wait:
                time.sleep(0.02)
        return -1 if wait else None

    def _raise_if_lost(self, cause: BaseException | None = None, settle: float = 0.0) -> None:
        """Raise SandboxLost if the container was removed or stopped under the sample (not by us).

        With `settle`, a container still marked running is looked at again for that long first.
        """
        short = (self.container_id or "?")[:12]
        deadline = time.monotonic() + settle
        while True:
            try:
                state = client().api.inspect_container(self.container_id).get("State") or {}
            except docker.errors.NotFound:
                raise SandboxLost(f"the sandbox container {short} was removed while the sample ran") from cause
            except ENGINE_ERRORS:
                return  # the engine cannot say: the caller reports what it saw
            if state.get("Status") in ("removing", "dead"):
                raise SandboxLost(f"the sandbox container {short} was removed while the sample ran") from cause
            if not state.get("Running"):
                raise SandboxLost(
                    f"the sandbox container {short} stopped while the sample ran "
                    f"({state.get('Status')}, exit code {state.get('ExitCode')})"
                ) from cause
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _kill(self, tag: str, pid: str | None) -> None:
        """Kill what the exec tagged `tag` started (see KILL); `pid`: its shell's, when it printed it."""
        if not self.container_id:
            return  # gone with its container
        try:
            self._exec(["sh", "-c", KILL, "sh", tag, pid if pid and pid.isdigit() else ""], timeout=10, user="0")
        except SandboxError:
            pass

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """A file's bytes (at most `limit`), symlinks followed; FileNotFoundError or IsADirectoryError as on a disk."""
        return docker_files.read(self, path, limit)

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file, making missing parent directories; owned by the image's user."""
        docker_files.write(self, path, data)

    def confine(self, path: str) -> str:
        """Any path: searches run inside the container, which is the confinement."""
        return path

    def cleanup(self) -> None:
        """Force-remove the container and its anonymous volumes (and the containers of its own processes that
        have one); never raises, safe to call twice."""
        cid, self.container_id = self.container_id, None
        if cid:
            remove(cid)
        self._resident.close()
        processes, self._processes = self._processes, []
        for process in processes:  # gone with the container (or with their own): this closes their connections
            process.kill()
        network, self._network = self._network, None
        if network:
            remove_network(network)


def container_env(spec: SandboxSpec, config: dict) -> dict[str, str]:
    """The variables a sample's container gets on top of its image's (`config`): PATH and LANG where the image
    sets none, HOME where its commands run as root, and the sample's own; nothing of the runner's."""
    image_env = {kv.split("=", 1)[0] for kv in config.get("Env") or []}
    env = {k: SANDBOX_ENV[k] for k in IMAGE_ENV if k not in image_env}
    user = (spec.resources.user if spec.resources else None) or config.get("User") or ""
    if user.split(":")[0] in ("", "root", "0"):
        env["HOME"] = "/root"
    env.update(dict(spec.resources.env) if spec.resources else {})
    return env
