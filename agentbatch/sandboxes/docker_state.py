"""A container's final state (--keep_final_state): what changed in it since it was made from its image, kept as a
gzip-compressed tar of the files added or changed and a list of the paths deleted (the engine's own `docker diff`),
and put back into a fresh container of the same image for a rescore (docs/sandboxes.md, "Final state")."""

from __future__ import annotations

import gzip
import io
import posixpath
import shlex
import tarfile
from typing import BinaryIO

import docker.errors

from agentbatch.sandboxes.base import SandboxError
from agentbatch.sandboxes.docker_container import DockerSandbox
from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

ADDED, CHANGED, DELETED = 1, 0, 2  # the engine's kinds of change
# What the engine makes in every container, never the agent's work: its mounts and kernel filesystems.
_NOT_STATE = ("/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/.dockerenv")


def save(sandbox: DockerSandbox, out: BinaryIO, limit: int) -> dict:
    """Write what changed in the container to `out` (gzip'd tar, at most `limit` bytes); the paths it deleted."""
    api = client().api
    try:
        changes = api.diff(sandbox.container_id) or []
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot list the container's changes: {message(e)}") from e
    kinds = {c["Path"]: c["Kind"] for c in changes if not _excluded(c["Path"])}
    counted = _Counted(out, limit)
    with gzip.GzipFile(fileobj=counted, mode="wb", compresslevel=6, mtime=0) as packed:
        with tarfile.open(fileobj=packed, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for path in _roots(kinds):
                _copy(api, sandbox.container_id, path, tar)
    return {"deleted": sorted(p for p, k in kinds.items() if k == DELETED and kinds.get(_parent(p)) != DELETED)}


def restore(sandbox: DockerSandbox, files: BinaryIO, notes: dict) -> None:
    """Put the kept files into a fresh container (the engine unpacks the gzip'd tar at /), then delete the paths
    the sample had deleted."""
    try:
        client().api.put_archive(sandbox.container_id, "/", files)  # streamed, never whole in memory
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot put the kept state into the container: {message(e)}") from e
    deleted = [p for p in notes.get("deleted") or () if isinstance(p, str) and p.startswith("/")]
    if deleted:
        done = sandbox.exec("rm -rf -- " + " ".join(shlex.quote(p) for p in deleted), timeout=120)
        if done.exit_code != 0:
            raise SandboxError(f"cannot delete what the sample deleted: {done.output.strip()[-300:]}")


def _roots(kinds: dict[str, int]) -> list[str]:
    """The paths to copy: every added path whose parent was not added (its whole tree is new), and every changed
    path with no change listed under it (a file; a directory with a change below is only its children's)."""
    below = {_parent(p) for p in kinds}
    roots = []
    for path, kind in sorted(kinds.items()):
        if kind == ADDED and kinds.get(_parent(path)) != ADDED:
            roots.append(path)
        elif kind == CHANGED and path not in below:
            roots.append(path)
    return roots


def _copy(api, container_id: str, path: str, tar: tarfile.TarFile) -> None:
    """One path of the container (a whole tree for a directory) into `tar`, named from /."""
    try:
        chunks, _stat = api.get_archive(container_id, path)
    except docker.errors.NotFound:
        return  # gone since the engine listed it (a process of the agent's still running)
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot read {path} from the container: {message(e)}") from e
    prefix = posixpath.dirname(path).lstrip("/")
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks), 1 << 16), mode="r|") as part:
        for member in part:
            member.name = posixpath.join(prefix, member.name)
            if member.islnk():
                member.linkname = posixpath.join(prefix, member.linkname)
            tar.addfile(member, part.extractfile(member) if member.isfile() else None)


def _excluded(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in _NOT_STATE)


def _parent(path: str) -> str:
    return posixpath.dirname(path)


class _Chunks(io.RawIOBase):
    """The engine's archive stream (an iterator of byte chunks) as a raw file (memoryviews: no chunk is copied)."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class _Counted:
    """A file that refuses writes past `limit` bytes in all (SandboxError: the state is not kept)."""

    def __init__(self, out: BinaryIO, limit: int):
        self._out, self._limit, self.written = out, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self._limit:
            raise SandboxError(f"what changed in the container is over {self._limit} bytes compressed")
        return self._out.write(data)

    def flush(self) -> None:
        self._out.flush()
