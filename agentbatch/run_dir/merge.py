"""trajectories.jsonl: every batch file's trajectories, merged in numeric order, written atomically.

Lines that do not count (record_shape.why_skipped: not JSON, not trajectories, calling a tool the run does not
have) are dropped and counted; lines of earlier sessions are read back through the session's reader, redacted
of its secrets. A few lead entries come first, together showing a value of every kind the file holds (a tool
call, logprobs, a reward...: trajectory.VALUE_KINDS): `datasets` fixes the schema from the file's first
block, and a kind it has not seen there fails the load. They are taken from the newest batches first, whose
lines carry every field a line can have (a resumed run may begin with lines written before a field existed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from agentbatch.run_dir import atomic, lines
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.lines import ACCOUNTED, ReadCounts
from agentbatch.run_dir.paths import TRAJECTORIES
from agentbatch.run_dir.reader import RunReader
from agentbatch.surrogates import has_escaped_surrogate, scrub_json
from trajectory import VALUE_KINDS, may_show, shown_kinds, with_tool_names


def merge(files: RunFiles, on_record: Callable[[dict], None] | None = None) -> ReadCounts:
    """Write trajectories.jsonl; `on_record` gets every kept trajectory the session did not account for itself."""
    counts = ReadCounts()
    reader = files.reader(redacted=True)  # lines of earlier sessions are copied: redacted of this one's secrets
    leads = _lead_entries(files, reader)
    with atomic.replacing(files.paths.path(TRAJECTORIES)) as out:
        for raw in leads.values():
            out.write(raw)
        for path, offset, raw, record in reader.raw_lines("trajectory", counts, accounted=files.accounted):
            if record is ACCOUNTED:  # written by this session, checked when it was (see RunFiles.append)
                line = raw
            elif (why := reader.why_skipped("trajectory", record)) is not None:
                counts.skip(why)
                continue
            else:
                line = _merged_line(raw, record, files)
                if on_record:
                    on_record(record)
            if (path, offset) not in leads:
                out.write(line if line.endswith(b"\n") else line + b"\n")
            counts.trajectories += 1
    return counts


def _lead_entries(files: RunFiles, reader: RunReader) -> dict[tuple[str, int], bytes]:
    """(batch path, offset) → line of the entries the merge keeps that show a kind no other lead did.

    A batch file this session wrote alone is not read: append noted where each kind first shows in it,
    so a run whose lines never show some kind (no logprobs, no checks) does not read every file twice.
    """
    leads: dict[tuple[str, int], bytes] = {}
    missing = set(VALUE_KINDS)
    for path in reversed(files.paths.batches()):
        accounted = files.accounted.get(path)
        if accounted and sum(accounted.values()) == _size(path):
            missing -= _known_leads(files, path, accounted, missing, leads)
            if not missing:
                return leads
            continue
        for offset, raw, _ in reader.read(path, parse=None):
            if not may_show(raw, missing):
                continue  # most lines: no JSON parsing
            record = lines.json_value(raw)
            if reader.why_skipped("trajectory", record) is not None:
                continue
            new = shown_kinds(record) & missing
            if new:
                line = _merged_line(raw, record, files)
                leads[path, offset] = line if line.endswith(b"\n") else line + b"\n"
                missing -= new
                if not missing:
                    return leads
    return leads


def _known_leads(files: RunFiles, path: str, accounted: dict[int, int], missing: set[str], leads: dict) -> set[str]:
    """The leads a search of `path` (every line this session's) would take, from append's notes; their kinds."""
    firsts = {kind: offset for kind, offset in files.kind_lines.get(path, {}).items() if kind in missing}
    found: set[str] = set()
    for offset in sorted(set(firsts.values())):
        line = _read_line(path, offset, accounted[offset])
        if line is not None:
            leads[path, offset] = line
            found.update(kind for kind, at in firsts.items() if at == offset)
    return found


def _read_line(path: str, offset: int, length: int) -> bytes | None:
    """The whole line this session appended at `offset`, or None if the file no longer holds it."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            line = f.read(length)
    except OSError:
        return None
    return line if len(line) == length and line.endswith(b"\n") else None


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _merged_line(raw: bytes, record: dict, files: RunFiles) -> bytes:
    """A kept line as trajectories.jsonl gets it: as written, unless it holds a lone surrogate (older versions
    wrote them as JSON escapes, which make the whole file unloadable) or was given entries for tools it lacked
    (a run resumed with other tools: with_tool_names), then rewritten."""
    fixed = with_tool_names(record, files.tool_names)
    changed = fixed is not record
    record = fixed
    if has_escaped_surrogate(raw) or changed:
        return (json.dumps(scrub_json(record), ensure_ascii=False) + "\n").encode("utf-8")
    return raw if raw.endswith(b"\n") else raw + b"\n"
