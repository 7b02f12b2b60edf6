"""A run directory read without changing it: which of its lines count, and what they say, redacted.

Every consumer of a run's lines reads them here: the resume scan (answers.py), the merge, the statistics, the
budget, the exports, the report and the oracle's verdict. Which lines count is record_shape.why_skipped; the
run's tools (a trajectory calling another is left out) come from tools.json, the built-ins for a run from
before it; every line and JSON file read goes through the one Redactor (secrets_guard) before it is parsed,
so a secret given here reaches no output, whatever the files hold. A finished, running or killed run reads
alike; a torn or wrong-shaped line is counted, never fatal.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from agentbatch.run_dir import artifacts, lines
from agentbatch.run_dir.lines import ReadCounts, json_value
from agentbatch.run_dir.paths import CHECKPOINT, DISCARDED, FAILED, TOOLS, RunPaths
from agentbatch.run_dir.record_shape import KINDS, why_skipped
from agentbatch.run_dir.spend import Spend
from agentbatch.secrets_guard import Redactor
from agentbatch.tool_set import ToolSet

Parse = Callable[[bytes], object]
MAX_ARTIFACT_SAMPLES, MAX_ARTIFACT_FILES = 2000, 50  # what artifacts() lists of the artifacts/ folder


@dataclass(frozen=True, slots=True)
class Line:
    """One line that counts, and where it was read."""

    kind: str  # one of KINDS
    record: dict
    raw: bytes  # as read, redacted
    file: str  # the file's name in the run directory
    line: int  # 1-based, among the file's lines that are not blank (a runner writes none)

    @property
    def size(self) -> int:
        return len(self.raw)


class RunReader:
    """One run directory's lines and JSON files, read as every consumer reads them.

    `secrets` (or a Redactor) are redacted from everything read; `tools` are the run's tools when the caller
    knows them (a session: its own and the recorded ones), else tools.json's.
    """

    def __init__(
        self, run_dir: str | os.PathLike, secrets: Iterable[str] | Redactor = (), tools: ToolSet | None = None
    ):
        self.paths = RunPaths(run_dir)
        self.dir = self.paths.dir
        self.redact = secrets if isinstance(secrets, Redactor) else Redactor(secrets)
        self._redact_line = self.redact.line if self.redact else None
        self.tool_set = tools or self.recorded_tools() or ToolSet()
        self.tool_names = self.tool_set.names
        self.known = frozenset(self.tool_names)
        self.counts = {kind: ReadCounts() for kind in KINDS}  # what everything() read and left out, per kind

    def exists(self) -> bool:
        """Whether the directory holds a run (a batch file, discards, failures or a checkpoint)."""
        return self.paths.holds_run()

    def read_json(self, name: str) -> dict:
        """One of the run's JSON files, redacted; {} if it is missing, unreadable or anything but an object."""
        return read_json(self.paths.path(name), self.redact) or {}

    def checkpoint(self) -> dict:
        return self.read_json(CHECKPOINT)

    def recorded_tools(self) -> ToolSet | None:
        """The tool set the run recorded (tools.json); None for a run from before it was kept, or a file not of it."""
        return ToolSet.from_record(read_json(self.paths.path(TOOLS)))

    def artifacts(self) -> list[list]:
        """[prompt index, sample index, folder, files] of each sample whose check kept files (run_dir/artifacts.py),
        in order, the folder relative to the run; at most MAX_ARTIFACT_SAMPLES samples and MAX_ARTIFACT_FILES files
        each. The files are listed by name, not read: the report links to them."""
        kept = sorted(artifacts.listed(self.paths).items())[:MAX_ARTIFACT_SAMPLES]
        folder = os.path.relpath(self.paths.artifacts(), self.dir)
        return [[i, n, f"{folder}/{i}-{n}", files[:MAX_ARTIFACT_FILES]] for (i, n), files in kept]

    def notes(self) -> list[str]:
        """A sentence for each entry named like a file of the run that is not a regular file: it is skipped."""
        return [
            f"{os.path.join(self.dir, name)} is {what}, not a file of the run: skipped"
            for name, what in self.paths.odd_files()
        ]

    def files(self, kind: str) -> list[str]:
        """The files holding lines of this kind: the batch files in numeric order, discarded.jsonl, failed.jsonl."""
        if kind == "trajectory":
            return self.paths.batches()
        return [self.paths.path(DISCARDED if kind == "discarded" else FAILED)]

    def read(
        self, path: str, counts: ReadCounts | None = None, parse: Parse | None = json_value, accounted=None
    ) -> Iterator[tuple[int, bytes, object]]:
        """One file's (offset, redacted line, parse(line)), as lines.read gives them."""
        return lines.read(path, counts, parse=parse, accounted=accounted, redact=self._redact_line)

    def raw_lines(
        self,
        kind: str,
        counts: ReadCounts | None = None,
        parse: Parse | None = json_value,
        accounted: dict[str, dict[int, int]] | None = None,
    ) -> Iterator[tuple[str, int, bytes, object]]:
        """(path, offset, redacted line, parse(line)) of every line of this kind, counting lines and bytes only;
        for readers that apply the rule themselves (why_skipped): the merge, the Parquet export."""
        for path in self.files(kind):
            for offset, raw, value in self.read(path, counts, parse, accounted.get(path) if accounted else None):
                yield path, offset, raw, value

    def why_skipped(self, kind: str, value: object) -> str | None:
        """record_shape.why_skipped with the run's tools."""
        return why_skipped(kind, value, self.known)

    def lines(self, kind: str, counts: ReadCounts | None = None, parse: Parse = json_value) -> Iterator[Line]:
        """The lines of this kind that count, in file order; `counts` gets the lines read and those left out."""
        known = self.known
        for path in self.files(kind):
            name = os.path.basename(path)
            numbered = enumerate(self.read(path, counts, parse), 1)
            for number, (_offset, raw, value) in numbered:
                why = why_skipped(kind, value, known)
                if why is not None:
                    if counts is not None:
                        counts.skip(why)
                    continue
                if counts is not None and kind == "trajectory":
                    counts.trajectories += 1
                yield Line(kind, value, raw, name, number)

    def trajectories(self, counts: ReadCounts | None = None, parse: Parse = json_value) -> Iterator[Line]:
        """The batch files' trajectories the merge keeps, in numeric order of the files."""
        return self.lines("trajectory", counts, parse)

    def discards(self, counts: ReadCounts | None = None, parse: Parse = json_value) -> Iterator[Line]:
        """discarded.jsonl's lines that are trajectory-shaped (others answer nothing and count nowhere)."""
        return self.lines("discarded", counts, parse)

    def failures(self, counts: ReadCounts | None = None, parse: Parse = json_value) -> Iterator[Line]:
        """failed.jsonl's JSON objects: every failed attempt."""
        return self.lines("failed", counts, parse)

    def everything(self) -> Iterator[Line]:
        """Trajectories, then discards, then failed attempts, counted in `counts` by kind."""
        return itertools.chain.from_iterable(self.lines(kind, self.counts[kind]) for kind in KINDS)

    def spend(self) -> Spend:
        """What every attempt recorded spent: each JSON object of the batch files, discards and failures, whether
        it counts as a trajectory or not (it was paid for all the same)."""
        spend = Spend()
        for kind in KINDS:
            for _path, _offset, _raw, value in self.raw_lines(kind):
                if type(value) is dict:
                    spend.add(value.get("usage"))
        return spend

    def blocks(self, counts: ReadCounts, block_bytes: int) -> Iterator[tuple[list[bytes], list[int]]]:
        """The batch files' lines, unparsed and redacted, in blocks of about block_bytes: (lines ending in a
        newline, their sizes); `counts` gets lines and bytes, the caller applies the rule (the Parquet export)."""
        block: list[bytes] = []
        sizes: list[int] = []
        size = 0
        for _path, _offset, raw, _ in self.raw_lines("trajectory", counts, parse=None):
            block.append(raw if raw.endswith(b"\n") else raw + b"\n")
            sizes.append(len(raw))
            size += len(raw)
            if size >= block_bytes:
                yield block, sizes
                block, sizes, size = [], [], 0
        if block:
            yield block, sizes


def read_json(path: str, redact: Redactor | None = None) -> dict | None:
    """A JSON object file, redacted; None if it is missing, not a regular file, unreadable or anything but an object."""
    f = lines.open_regular(path)
    if f is None:
        return None
    try:
        with f:
            text = f.read().decode("utf-8")
        value = json.loads(redact(text) if redact else text)
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None
