"""The one reader of a run's JSONL files (batch files, discarded.jsonl, failed.jsonl): every line, parsed once.

A kill can leave a torn last line, a hand edit or another tool a line that is not JSON: such lines are
counted and skipped, never fatal. Lines of ~10 KB are read through a 1 MiB buffer: with the default 8 KB
one each line takes several reads and joins (4x the CPU). Only regular files are read: a directory or a
FIFO named like a run's file has no lines (and a FIFO would block the reader forever).
"""

from __future__ import annotations

import json
import os
import stat
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

try:  # several times faster than json on long lines: most of reading a run is parsing (bench/RESULTS.md, (4), (15)).
    # Not orjson: it reads any depth and crashes the process past ~50,000 nested objects; msgspec stops where
    # json does (Python's recursion limit), so the same lines are JSON whichever parser is installed.
    from msgspec.json import Decoder as _Decoder

    _fast_loads = _Decoder().decode
except ImportError:  # it comes with batch-runner[export]
    _fast_loads = json.loads

READ_BUFFER = 1 << 20
NOT_JSON = object()  # the value of a line that does not parse
# The value of a line this session appended and its caller accounted for: not parsed again (files.py).
ACCOUNTED = types.MappingProxyType({})


@dataclass
class ReadCounts:
    """What reading a run's batch files found: lines and bytes read, the lines dropped and why, the trajectories."""

    lines: int = 0  # not blank
    bytes: int = 0
    not_json: int = 0
    malformed: int = 0  # valid JSON of another shape than a trajectory line (record_shape.py)
    unknown_tool: int = 0
    trajectories: int = 0

    def skip(self, why: str) -> None:
        """Count a line left out, by the reason record_shape.why_skipped gave."""
        setattr(self, why, getattr(self, why) + 1)

    def skipped(self) -> dict[str, int]:
        """The lines left out, by why."""
        return {"not_json": self.not_json, "malformed": self.malformed, "unknown_tool": self.unknown_tool}


def json_value(raw: bytes) -> object:
    """A line's JSON value as the standard library reads it, or NOT_JSON (torn, corrupt, nested past any sane depth)."""
    try:
        return _fast_loads(raw)
    except ValueError:  # msgspec refuses NaN, lone surrogate escapes and numbers past a float, which json takes
        pass
    except RecursionError:
        return NOT_JSON
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return NOT_JSON


def open_regular(path: str) -> BinaryIO | None:
    """The file open for reading, or None when it is missing or not a regular file (never waits on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
        return open(fd, "rb", buffering=READ_BUFFER)
    except BaseException:
        os.close(fd)
        raise


def read(
    path: str,
    counts: ReadCounts | None = None,
    *,
    parse: Callable[[bytes], object] | None = json_value,
    accounted: dict[int, int] | None = None,
    redact: Callable[[bytes], bytes] | None = None,
) -> Iterator[tuple[int, bytes, object]]:
    """(offset, line, value) of every line that is not blank; a missing file, or one that is not a regular file,
    has none.

    `value` is parse(line) (None without `parse`), or ACCOUNTED for a line `accounted` (offset → length) lists
    (written and redacted by this session). Every other line goes through `redact` (secrets_guard.Redactor.line)
    before it is parsed or yielded; `counts` gets its lines and bytes.
    """
    f = open_regular(path)
    if f is None:
        return
    offset = 0
    with f:
        for raw in f:
            at, offset = offset, offset + len(raw)
            if counts is not None:
                counts.bytes += len(raw)
            if raw.isspace():
                continue
            if counts is not None:
                counts.lines += 1
            if accounted is not None and accounted.get(at) == len(raw):
                yield at, raw, ACCOUNTED
                continue
            if redact is not None:
                raw = redact(raw)
            yield at, raw, parse(raw) if parse is not None else None
