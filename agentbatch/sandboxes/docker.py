"""The Docker backend: one labelled container per prompt, driven through the docker SDK.

A container runs an idle shell loop as PID 1; every command is a `docker exec` of `sh -c` (bash when the
image has it) in the working directory, with a deadline enforced from the host. Files move through the
archive API, so reading and writing work in images that hold no tools at all. The working directory is
the row's `cwd`, else the image's WORKDIR, else /workspace; Docker creates it if absent.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
import select
import socket
import struct
import tarfile
import threading
import time
import uuid

import docker
import docker.errors
import requests
from docker.utils.socket import read as socket_read

from agentbatch.sandboxes.base import ExecResult, Resources, SandboxError, SandboxLost, SandboxSpec
from agentbatch.sandboxes.output import KILL_GRACE
from agentbatch.sandboxes.output import BoundedOutput as _Output

RUN_LABEL = "batch_runner.run"
DEFAULT_WORKDIR = "/workspace"
# PID 1 must outlive every command yet exit on SIGTERM; only sh and sleep are assumed in the image.
KEEPALIVE = ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"]
PROBE = "command -v bash 2>/dev/null || echo; id -u 2>/dev/null || echo 0; id -g 2>/dev/null || echo 0"
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
MAX_FILE_BYTES = 64 * 1024 * 1024
# A forced removal kills the command before the engine marks its container gone: how long a SIGKILLed
# command waits for that mark before it counts as killed by something inside the container (OOM, say).
LOST_SETTLE = 5.0
_SYMLINK_BIT = 1 << 27  # Go's os.ModeSymlink, as the archive API reports it
_DIR_BIT = 1 << 31  # Go's os.ModeDir

# requests errors (engine socket gone, say) are not DockerExceptions but mean the same to us.
_ENGINE_ERRORS = (docker.errors.DockerException, requests.RequestException)
_local = threading.local()
_image_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}
_images_present: set[str] = set()
_storage_refused: list[str] = []  # the engine said once that it cannot limit a container's disk: not asked again


def _client() -> docker.DockerClient:
    """This thread's client: the SDK does not promise a client is safe to share, and a fork must not inherit one."""
    client = getattr(_local, "client", None)
    if client is None or _local.pid != os.getpid():
        try:
            client = docker.from_env(timeout=120)
        except docker.errors.DockerException as e:
            raise SandboxError(
                f"cannot reach the Docker engine ({_one_line(e)}); is it running, is DOCKER_HOST right?"
            ) from e
        _local.client, _local.pid = client, os.getpid()
    return client


def _one_line(e: BaseException) -> str:
    text = getattr(e, "explanation", None) or str(e)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return re.sub(r"\s+", " ", str(text)).strip()[:500]


def prepare(spec: SandboxSpec) -> None:
    """Make sure the prompt's image is here, pulling it if not; raise SandboxError at once if it cannot be had."""
    image = spec.image or spec.settings.docker_image
    if not image:
        raise SandboxError("no Docker image given: set the default image flag or the row's image")
    if spec.cwd and not posixpath.isabs(spec.cwd):
        raise SandboxError(f"cwd {spec.cwd!r} must be an absolute path inside the container")
    if image in _images_present:
        return
    with _image_lock:
        lock = _image_locks.setdefault(image, threading.Lock())
    with lock:  # parallel prompts on one image pull it once
        if image in _images_present:
            return
        client = _client()
        try:
            client.images.get(image)
        except docker.errors.ImageNotFound:
            try:
                client.images.pull(image)
            except _ENGINE_ERRORS as e:
                raise SandboxError(f"Docker image {image!r} is not here and could not be pulled: {_one_line(e)}") from e
        except _ENGINE_ERRORS as e:
            raise SandboxError(f"cannot inspect Docker image {image!r}: {_one_line(e)}") from e
        _images_present.add(image)


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


def container_name(run_name: str) -> str:
    """A unique, Docker-valid container name that shows which run made it."""
    safe = re.sub(r"[^a-zA-Z0-9_.-]+", "-", run_name).strip("-.")[:40] or "run"
    return f"br-{safe}-{uuid.uuid4().hex[:10]}"


class DockerSandbox:
    """One container for one prompt; started when constructed, force-removed by cleanup()."""

    def __init__(self, spec: SandboxSpec):
        prepare(spec)
        client = _client()
        self.spec = spec
        self.image = image = spec.image or spec.settings.docker_image
        self.container_id: str | None = None
        try:
            config = client.images.get(image).attrs.get("Config") or {}
        except _ENGINE_ERRORS as e:
            raise SandboxError(f"cannot inspect Docker image {image!r}: {_one_line(e)}") from e
        self.workdir = spec.cwd or config.get("WorkingDir") or DEFAULT_WORKDIR
        user = config.get("User") or ""
        image_env = {kv.split("=", 1)[0] for kv in config.get("Env") or []}
        # Only these reach the container (on top of the image's own ENV): the runner's environment never does.
        env = {k: v for k, v in BASE_ENV.items() if k not in image_env}
        if user.split(":")[0] in ("", "root", "0"):
            env["HOME"] = "/root"
        env.update(dict(spec.resources.env) if spec.resources else {})
        labels = {**spec.labels, RUN_LABEL: spec.run_name}
        limits, network = _limits(spec)
        create = dict(
            entrypoint=KEEPALIVE,
            command=[],
            name=container_name(spec.run_name),
            working_dir=self.workdir,
            environment=env,
            labels=labels,
            network_mode="bridge" if network else "none",
            detach=True,
            stdin_open=False,
            tty=False,
        )
        try:
            if _storage_refused:
                limits.pop("storage_opt", None)
            try:
                container = client.containers.create(image, **create, **limits)
            except docker.errors.APIError as e:
                # storage_opt size needs a driver that can enforce it (overlay2 on xfs with pquota, btrfs, zfs...)
                if "storage_opt" not in limits or "storage-opt" not in _one_line(e).lower():
                    raise
                _storage_refused.append(_one_line(e))
                limits.pop("storage_opt")
                container = client.containers.create(image, **create, **limits)
        except _ENGINE_ERRORS as e:
            raise SandboxError(f"cannot create a container from {image!r}: {_one_line(e)}") from e
        self.container_id = container.id
        try:
            container.start()
            self.shell, self._uid, self._gid = self._run_probe()
            if self._uid != 0:
                self._give_empty_workdir_to_user()
        except _ENGINE_ERRORS as e:
            self.cleanup()
            raise SandboxError(f"cannot start a container from {image!r}: {_one_line(e)}") from e
        except BaseException:
            self.cleanup()
            raise

    def _run_probe(self) -> tuple[str, int, int]:
        """Which shell the image offers and whose files we write (so a non-root user can edit them)."""
        result = self._exec(["sh", "-c", PROBE], timeout=30)
        if result.exit_code != 0 or result.timed_out:
            raise SandboxError(f"image {self.image!r} cannot run sh in its container: {result.output.strip()[:300]}")
        lines = (result.output.splitlines() + ["", "0", "0"])[:3]
        ids = [int(x) if x.strip().isdigit() else 0 for x in lines[1:]]
        return lines[0].strip() or "sh", ids[0], ids[1]

    def _give_empty_workdir_to_user(self) -> None:
        """Docker creates a missing working directory as root; a non-root image user could not write there."""
        script = f'[ -z "$(ls -A "$1" 2>/dev/null)" ] && chown {self._uid}:{self._gid} "$1"; true'
        self._exec(["sh", "-c", script, "sh", self.workdir], timeout=30, user="0")

    def exec(self, command: str, timeout: float) -> ExecResult:
        """Run a shell command in the working directory; past the timeout its whole session is killed."""
        # The first line of output is the shell's PID (a session leader), so a timeout can kill what it started.
        script = 'echo "$$"; exec 2>&1\n' + command
        return self._exec([self.shell, "-c", script], timeout, pid_first=True)

    def _exec(self, cmd: list[str], timeout: float, pid_first: bool = False, user: str = "") -> ExecResult:
        if not self.container_id:
            raise SandboxError("the sandbox was already cleaned up")
        api = _client().api
        try:
            exec_id = api.exec_create(
                self.container_id,
                cmd,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                workdir=self.workdir,
                user=user,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except _ENGINE_ERRORS as e:
            self._raise_if_lost(e)
            raise SandboxError(f"the sandbox container cannot run commands: {_one_line(e)}") from e
        out = _Output()
        try:
            eof = _pump(sock, out, time.monotonic() + max(float(timeout), 0.1))
            pid = out.take_first_line() if pid_first else None
            if not eof:
                self._kill_session(pid)
                _pump(sock, out, time.monotonic() + KILL_GRACE)
        finally:
            _close(sock)
        if not eof:
            self._raise_if_lost()
            return ExecResult(out.text(), -9, timed_out=True)
        code = self._exit_code(exec_id)
        if code < 0 or code == 137:  # SIGKILLed: by its own doing, or because its container went away
            self._raise_if_lost(settle=LOST_SETTLE)
        return ExecResult(out.text(), code)

    def _exit_code(self, exec_id: str) -> int:
        api = _client().api
        # The stream can close a moment before the engine records the exit code.
        for _ in range(50):
            try:
                info = api.exec_inspect(exec_id)
            except _ENGINE_ERRORS:  # the exec went with its container
                return -1
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return -1

    def _raise_if_lost(self, cause: BaseException | None = None, settle: float = 0.0) -> None:
        """Raise SandboxLost if the container was removed or stopped under the prompt (not by us).

        With `settle`, a container still marked running is looked at again for that long first.
        """
        short = (self.container_id or "?")[:12]
        deadline = time.monotonic() + settle
        while True:
            try:
                state = _client().api.inspect_container(self.container_id).get("State") or {}
            except docker.errors.NotFound:
                raise SandboxLost(f"the sandbox container {short} was removed while the prompt ran") from cause
            except _ENGINE_ERRORS:
                return  # the engine cannot say: the caller reports what it saw
            if state.get("Status") in ("removing", "dead"):
                raise SandboxLost(f"the sandbox container {short} was removed while the prompt ran") from cause
            if not state.get("Running"):
                raise SandboxLost(
                    f"the sandbox container {short} stopped while the prompt ran "
                    f"({state.get('Status')}, exit code {state.get('ExitCode')})"
                ) from cause
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _kill_session(self, pid: str | None) -> None:
        """Kill every process of the timed-out command's session; all but PID 1 if its PID never arrived."""
        # In /proc/N/stat the fields after ") " are: state ppid pgrp session. kill is a shell builtin.
        script = (
            f"kill -9 -{pid} 2>/dev/null; for f in /proc/[0-9]*/stat; do "
            'read -r l < "$f" 2>/dev/null || continue; set -- ${l##*") "}; '
            f'[ "$4" = {pid} ] || continue; p=${{f#/proc/}}; kill -9 "${{p%/stat}}" 2>/dev/null; done; true'
            if pid and pid.isdigit()
            else "kill -9 -1 2>/dev/null; true"
        )
        try:
            self._exec(["sh", "-c", script], timeout=10)
        except SandboxError:
            pass

    def _path(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        """A file's bytes (at most `limit`), symlinks followed; FileNotFoundError or IsADirectoryError as on a disk."""
        full = self._path(path)
        api = _client().api
        for _ in range(10):
            try:
                chunks, stat = api.get_archive(self.container_id, full)
            except docker.errors.NotFound as e:
                self._raise_if_lost(e)
                raise FileNotFoundError(f"no such file in the sandbox: {full}") from None
            except _ENGINE_ERRORS as e:
                raise OSError(f"cannot read {full}: {_one_line(e)}") from e
            mode = stat.get("mode", 0)
            if mode & _SYMLINK_BIT and stat.get("linkTarget"):
                _discard(chunks)
                full = stat["linkTarget"]
                continue
            if mode & _DIR_BIT:
                _discard(chunks)
                raise IsADirectoryError(f"{full} is a directory")
            if stat.get("size", 0) > MAX_FILE_BYTES:
                _discard(chunks)
                raise OSError(f"{full} is {stat['size']} bytes, over the {MAX_FILE_BYTES} byte limit")
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
                member = next((m for m in tar.getmembers() if m.isfile()), None)
                if member is None:
                    raise OSError(f"{full} is not a regular file")
                return tar.extractfile(member).read(limit)
        raise OSError(f"too many levels of symbolic links: {path}")

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace a file, making missing parent directories; owned by the image's user."""
        full = self._path(path)
        if full == "/":
            raise IsADirectoryError("/ is a directory")
        api = _client().api
        # Extract at the deepest directory that exists, so no existing path (a symlinked /lib, say) is replaced.
        target, missing = posixpath.dirname(full), [posixpath.basename(full)]
        while True:
            try:
                _put_archive(api, self.container_id, target, self._tar(missing, data))
                return
            except docker.errors.NotFound as e:
                self._raise_if_lost(e)
                if target == "/":
                    raise OSError(f"cannot write {full}: the container has no root directory") from None
                missing.insert(0, posixpath.basename(target))
                target = posixpath.dirname(target)
            except _ENGINE_ERRORS as e:
                raise OSError(f"cannot write {full}: {_one_line(e)}") from e

    def _tar(self, parts: list[str], data: bytes) -> bytes:
        buf, now = io.BytesIO(), time.time()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(1, len(parts)):
                info = tarfile.TarInfo("/".join(parts[:i]))
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                info.uid, info.gid, info.mtime = self._uid, self._gid, now
                tar.addfile(info)
            info = tarfile.TarInfo("/".join(parts))
            info.size, info.mode = len(data), 0o644
            info.uid, info.gid, info.mtime = self._uid, self._gid, now
            tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    def confine(self, path: str) -> str:
        """Any path: searches run inside the container, which is the confinement."""
        return path

    def cleanup(self) -> None:
        """Force-remove the container and its anonymous volumes; never raises, safe to call twice."""
        cid, self.container_id = self.container_id, None
        if cid:
            _remove(cid)


def _pump(sock, out: _Output, deadline: float) -> bool:
    """Copy the multiplexed exec stream (8-byte frame headers) into out until EOF (True) or the deadline (False)."""
    pending = bytearray()
    while True:
        if not _wait_readable(sock, deadline - time.monotonic()):
            return False
        data = socket_read(sock, 65536)
        if not data:
            return True
        pending += data
        while len(pending) >= 8:
            size = struct.unpack(">L", pending[4:8])[0]
            if len(pending) < 8 + size:
                break
            out.add(bytes(pending[8 : 8 + size]))
            del pending[: 8 + size]


def _wait_readable(sock, remaining: float) -> bool:
    if getattr(sock, "pending", None) and sock.pending():  # TLS may hold decrypted bytes select cannot see
        return True
    if remaining <= 0:
        return False
    ready, _, _ = select.select([sock], [], [], remaining)
    return bool(ready)


def _close(sock) -> None:
    """Drop the exec connection for good, even if a straggler process still holds its output open."""
    raw = getattr(sock, "_sock", sock)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        raw.shutdown(socket.SHUT_RDWR)
    response = getattr(sock, "_response", None)
    with contextlib.suppress(OSError, ValueError, requests.RequestException):
        if response is not None:
            response.close()
        sock.close()


def _put_archive(api, container_id: str, path: str, data: bytes) -> None:
    """APIClient.put_archive plus noOverwriteDirNonDir, so writing a file over a directory fails, not wipes it."""
    params = {"path": path, "noOverwriteDirNonDir": "1"}
    res = api._put(api._url("/containers/{0}/archive", container_id), params=params, data=data)
    api._raise_for_status(res)


def _discard(chunks) -> None:
    close = getattr(chunks, "close", None)
    if close:
        close()


def _remove(container_id: str) -> bool:
    try:
        _client().api.remove_container(container_id, force=True, v=True)
        return True
    except (
        docker.errors.DockerException,
        requests.RequestException,
        OSError,
        SandboxError,
    ):
        return False  # already gone, or the engine is away: a later reap removes it by its label


def create(spec: SandboxSpec) -> DockerSandbox:
    return DockerSandbox(spec)


def reap(labels: dict[str, str]) -> int:
    """Remove every container carrying all these labels (a dead session's, see base.RUN_DIR_LABEL); how many."""
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    try:
        found = _client().api.containers(all=True, quiet=True, filters=filters)
    except _ENGINE_ERRORS as e:
        raise SandboxError(f"cannot list containers: {_one_line(e)}") from e
    return sum(_remove(c["Id"]) for c in found)
