"""The one reader of a run's JSONL files (batch files, discarded.jsonl, failed.jsonl): every line, parsed once.

A kill can leave a torn last line, a hand edit or another tool a line that is not JSON: such lines are
counted and skipped, never fatal. Lines of ~10 KB are read through a 1 MiB buffer: with the default 8 KB
one each line takes several reads and joins (4x the CPU).
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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


def json_value(raw: bytes) -> object:
    """A line's JSON value as the standard library reads it, or NOT_JSON (torn, corrupt, nested past any sane depth)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return NOT_JSON


def read(
    path: str,
    counts: ReadCounts | None = None,
    *,
    parse: Callable[[bytes], object] | None = json_value,
    accounted: dict[int, int] | None = None,
    secrets: tuple[bytes, ...] = (),
) -> Iterator[tuple[int, bytes, object]]:
    """(offset, line, value) of every line that is not blank; a missing file has none.

    `value` is parse(line) (None without `parse`), or ACCOUNTED for a line `accounted` (offset → length) lists.
    Each line is redacted of `secrets` before it is parsed or yielded; `counts` gets its lines and bytes.
    """
    try:
        f = open(path, "rb", buffering=READ_BUFFER)
    except FileNotFoundError:
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
            for s in secrets:
                if s in raw:
                    raw = raw.replace(s, b"[REDACTED]")
            if accounted is not None and accounted.get(at) == len(raw):
                yield at, raw, ACCOUNTED
            else:
                yield at, raw, parse(raw) if parse is not None else None


def records(path: str) -> Iterator[dict]:
    """The JSON objects of a file, skipping torn or corrupt lines and JSON of another kind."""
    for _offset, _raw, value in read(path):
        if type(value) is dict:
            yield value
