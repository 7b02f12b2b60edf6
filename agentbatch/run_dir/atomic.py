"""The one atomic writer of a run directory: a file, or an export's folder, replaced whole or not at all.

Each file has one writer at a time (the session's lock, or the exports' lock: lock.py), so a file's
temporary name is fixed (`<name>.tmp`): a killed writer's leftover is overwritten by the next.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def replacing(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A file to write that replaces `path` once written and synced (write, fsync, rename); on any failure the
    old file stays as it was and no half-written temporary file is left."""
    tmp = os.fspath(path) + ".tmp"
    try:
        with open(tmp, "wb", buffering=1 << 20) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Replace a text file atomically."""
    with replacing(path) as f:
        f.write(text.encode("utf-8"))


# renameat2(RENAME_EXCHANGE): swap two directories in one step, so a reader never sees neither.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


@contextlib.contextmanager
def replacing_dir(target: Path) -> Iterator[Path]:
    """A fresh directory to fill; on success it replaces `target` whole, on failure it is removed and target kept.

    Leftovers of a killed writer are swept first: the caller holds the lock of the folder's parent (the
    exports' lock), so no live writer owns them.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in target.parent.glob(f".{target.name}.*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if not target.exists():
            os.rename(tmp, target)
        elif _exchange(tmp, target):
            shutil.rmtree(tmp)  # now holds the previous export
        else:  # a filesystem without RENAME_EXCHANGE: two renames, the old one out of the way first
            old = target.parent / f".{target.name}.old-{os.getpid()}"
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
