"""A docker sandbox's files, moved through the engine's archive API: reading and writing work in images that
hold no tools at all. Paths are the sandbox's (relative ones below its working directory)."""

from __future__ import annotations

import io
import posixpath
import tarfile
import time

import docker.errors

from agentbatch.sandboxes.base import MAX_FILE_BYTES
from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

_SYMLINK_BIT = 1 << 27  # Go's os.ModeSymlink, as the archive API reports it
_DIR_BIT = 1 << 31  # Go's os.ModeDir


def _path(sandbox, path: str) -> str:
    return posixpath.normpath(posixpath.join(sandbox.workdir, path))


def read(sandbox, path: str, limit: int | None = None) -> bytes:
    """DockerSandbox.read_file: a file's bytes (at most `limit`), symlinks followed; FileNotFoundError or
    IsADirectoryError as on a disk."""
    full = _path(sandbox, path)
    api = client().api
    for _ in range(10):
        try:
            chunks, stat = api.get_archive(sandbox.container_id, full)
        except docker.errors.NotFound as e:
            sandbox._raise_if_lost(e)
            raise FileNotFoundError(f"no such file in the sandbox: {full}") from None
        except ENGINE_ERRORS as e:
            raise OSError(f"cannot read {full}: {message(e)}") from e
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


def write(sandbox, path: str, data: bytes) -> None:
    """DockerSandbox.write_file: create or replace a file, making missing parent directories; owned by the image's
    user (the sandbox's probed uid and gid)."""
    full = _path(sandbox, path)
    if full == "/":
        raise IsADirectoryError("/ is a directory")
    api = client().api
    # Extract at the deepest directory that exists, so no existing path (a symlinked /lib, say) is replaced.
    target, missing = posixpath.dirname(full), [posixpath.basename(full)]
    while True:
        try:
            _put_archive(api, sandbox.container_id, target, _tar(missing, data, sandbox._uid, sandbox._gid))
            return
        except docker.errors.NotFound as e:
            sandbox._raise_if_lost(e)
            if target == "/":
                raise OSError(f"cannot write {full}: the container has no root directory") from None
            missing.insert(0, posixpath.basename(target))
            target = posixpath.dirname(target)
        except ENGINE_ERRORS as e:
            raise OSError(f"cannot write {full}: {message(e)}") from e


def _tar(parts: list[str], data: bytes, uid: int, gid: int) -> bytes:
    buf, now = io.BytesIO(), time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(1, len(parts)):
            info = tarfile.TarInfo("/".join(parts[:i]))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            info.uid, info.gid, info.mtime = uid, gid, now
            tar.addfile(info)
        info = tarfile.TarInfo("/".join(parts))
        info.size, info.mode = len(data), 0o644
        info.uid, info.gid, info.mtime = uid, gid, now
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _put_archive(api, container_id: str, path: str, data: bytes) -> None:
    """APIClient.put_archive plus noOverwriteDirNonDir, so writing a file over a directory fails, not wipes it."""
    params = {"path": path, "noOverwriteDirNonDir": "1"}
    res = api._put(api._url("/containers/{0}/archive", container_id), params=params, data=data)
    api._raise_for_status(res)


def _discard(chunks) -> None:
    close = getattr(chunks, "close", None)
    if close:
        close()
