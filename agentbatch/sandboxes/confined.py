"""File access confined beneath a directory, safe against a command racing the file tools.

Every path component is opened relative to the directory already opened before it, with O_NOFOLLOW: a
symlink anywhere on the way is refused (`SymlinkRefused`), so no symlink, swapped in before or during the
call, can lead outside. `..` is resolved on the text of the path and may not climb above the directory.
Only regular files are read or written (a FIFO, a device or a directory is refused before it can block or
stream forever), at most `limit` bytes are read, and a file with more than one hard link is never written:
through a link the write would change a file elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class SymlinkRefused(PermissionError):
    """The path goes through a symbolic link."""


class OutsideRefused(PermissionError):
    """The path leads above the directory it must stay beneath."""


def parts_beneath(base: str, path: str) -> list[str] | None:
    """The components of absolute `path` below directory `base`, resolving `..` on the text; None if not below."""
    path = posixpath.normpath(path)
    base = posixpath.normpath(base)
    if base == "/":
        rel = path.lstrip("/")
    elif path == base:
        rel = ""
    elif path.startswith(base + "/"):
        rel = path[len(base) + 1 :]
    else:
        return None
    return [p for p in rel.split("/") if p]


def read(root: str, parts: list[str], limit: int, others_only: bool = False) -> bytes:
    """At most `limit` bytes of the regular file root/parts.

    `others_only`: refuse (PermissionError) unless every directory on the way is searchable and the file
    readable by any user, for a caller reading on behalf of an unprivileged user it does not run as.
    """
    if not parts:
        raise IsADirectoryError(f"{root} is a directory")
    with _walk(root, parts[:-1], create=False, others_only=others_only) as dir_fd:
        fd = _open_final(dir_fd, parts[-1], os.O_RDONLY)
    try:
        info = os.fstat(fd)
        _regular(info, parts[-1])
        if others_only and not info.st_mode & stat.S_IROTH:
            raise PermissionError(f"{parts[-1]}: permission denied")
        chunks, size = [], 0
        while size < limit:
            data = os.read(fd, min(limit - size, 1 << 20))
            if not data:
                break
            chunks.append(data)
            size += len(data)
        return b"".join(chunks)
    finally:
        os.close(fd)


def write(root: str, parts: list[str], data: bytes, owner: tuple[int, int] | None = None) -> None:
    """Create or replace the regular file root/parts with data, making missing directories (owned by `owner`)."""
    if not parts:
        raise IsADirectoryError(f"{root} is a directory")
    with _walk(root, parts[:-1], create=True, owner=owner) as dir_fd:
        name = parts[-1]
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FILE_FLAGS, 0o644, dir_fd=dir_fd)
            created = True
        except FileExistsError:
            fd = _open_final(dir_fd, name, os.O_WRONLY)
            created = False
    try:
        info = os.fstat(fd)
        _regular(info, name)
        if info.st_nlink > 1:
            raise PermissionError(
                f"{name} has {info.st_nlink} hard links: writing it would change the other files too; "
                "remove it first or write another path"
            )
        if created and owner is not None:
            os.fchown(fd, *owner)
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def check_start(root: str, parts: list[str]) -> None:
    """Raise unless root/parts is reached without a symlink, itself included (a search may start there)."""
    if not parts:
        return
    with _walk(root, parts[:-1], create=False) as dir_fd:
        try:
            info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # nothing there: the search finds nothing
        if stat.S_ISLNK(info.st_mode):
            raise SymlinkRefused(f"{parts[-1]} is a symbolic link; the file tools do not follow symbolic links here")


@contextlib.contextmanager
def _walk(root: str, parts: list[str], create: bool, owner: tuple[int, int] | None = None, others_only=False):
    """An fd of the directory root/parts, every component opened with O_NOFOLLOW below the one before."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _searchable(fd, root, others_only)
        for name in parts:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise FileNotFoundError(errno.ENOENT, "no such file or directory", name) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                child = _open_dir(fd, name)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    child = _open_dir(fd, name)  # says which of the two, or succeeds if it was replaced by a dir
                else:
                    raise
            os.close(fd)
            fd = child
            _searchable(fd, name, others_only)
        yield fd
    finally:
        os.close(fd)


def _open_dir(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise SymlinkRefused(
                f"{name} is a symbolic link; the file tools do not follow symbolic links here"
            ) from None
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", name) from None


def _open_final(dir_fd: int, name: str, mode: int) -> int:
    try:
        return os.open(name, mode | _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SymlinkRefused(
                f"{name} is a symbolic link; the file tools do not follow symbolic links here"
            ) from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, a socket
            raise OSError(f"{name} is not a regular file") from None
        if e.errno == errno.EISDIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory", name) from None
        raise


def _regular(info: os.stat_result, name: str) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", name)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{name} is not a regular file (a FIFO, device or socket); the file tools read only files")


def _searchable(fd: int, name: str, others_only: bool) -> None:
    if others_only and not os.fstat(fd).st_mode & stat.S_IXOTH:
        raise PermissionError(f"{name}: permission denied")
