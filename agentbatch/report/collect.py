"""Everything the report reads from a run directory, in one place: the lines of its batch files, discards and
failed attempts (kept or skipped by the merge's rules), checkpoint.json and statistics.json.

Read-only, so a finished, running or killed run works alike; a torn or wrong-shaped line is skipped and
counted, as the merge does (README, "Output"). Every line is redacted of the given secrets before it is parsed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from agentbatch.record_shape import trajectory_problem
from agentbatch.run_files import RunFiles
from agentbatch.secrets_guard import MIN_PART, Redactor
from trajectory import unknown_tools

try:  # 3-5x faster than json on long lines, as in the export
    from orjson import loads as _fast_loads
except ImportError:
    _fast_loads = json.loads

DISCARDED = "discarded.jsonl"
FAILED = "failed.jsonl"
# What a line is: a trajectory of a batch file, a discarded sample, or a failed attempt.
KINDS = ("trajectory", "discarded", "failed")


@dataclass
class Skipped:
    """Lines of one kind of file that were left out, by why (as statistics.json's `merge` counts them)."""

    not_json: int = 0  # torn (a kill mid-write) or corrupt
    malformed: int = 0  # JSON of another shape than the file's lines
    unknown_tool: int = 0  # a trajectory calling a tool of no toolset

    def total(self) -> int:
        return self.not_json + self.malformed + self.unknown_tool


@dataclass(frozen=True)
class Line:
    """One record the report shows, with where it was read (file name, 1-based line number)."""

    kind: str
    record: dict
    file: str
    line: int
    size: int  # bytes of the line as read


@dataclass
class RunReader:
    """One run directory, read without changing it."""

    path: Path
    secrets: tuple[str, ...] = ()
    skipped: dict[str, Skipped] = field(default_factory=lambda: {k: Skipped() for k in KINDS})

    def __post_init__(self):
        self.path = Path(self.path)
        self._files = RunFiles(str(self.path))
        self._redact = Redactor(self.secrets)
        # The bytes whose presence sends a line through the redactor (a secret's head or tail is enough).
        self._marks = tuple({p.encode() for s in self._redact.secrets for p in (s[:MIN_PART], s[-MIN_PART:])})

    @property
    def name(self) -> str:
        return self.path.name

    def exists(self) -> bool:
        """Whether the directory holds a run (a batch file, discards, failures or a checkpoint)."""
        return self.path.is_dir() and self._files.has_output()

    def checkpoint(self) -> dict:
        return self._files.read_json("checkpoint.json") or {}

    def statistics(self) -> dict:
        """statistics.json as the last session to end wrote it (a running or killed run's may be older)."""
        return self._files.read_json("statistics.json") or {}

    def lines(self) -> Iterator[Line]:
        """The trajectories the merge keeps (batch files in numeric order), then discards, then failed attempts."""
        for n in self._files.batch_numbers():
            name = f"batch_{n}.jsonl"
            for number, size, record in self._records(name, "trajectory"):
                if trajectory_problem(record) is not None:
                    self.skipped["trajectory"].malformed += 1
                elif unknown_tools(record["conversations"]):
                    self.skipped["trajectory"].unknown_tool += 1
                else:
                    yield Line("trajectory", record, name, number, size)
        for number, size, record in self._records(DISCARDED, "discarded"):
            if trajectory_problem(record) is None:
                yield Line("discarded", record, DISCARDED, number, size)
            else:
                self.skipped["discarded"].malformed += 1
        for number, size, record in self._records(FAILED, "failed"):
            # Any object counts in the statistics (its usage was paid for); one without a prompt is still shown.
            yield Line("failed", record, FAILED, number, size)

    def _records(self, name: str, kind: str) -> Iterator[tuple[int, int, dict]]:
        skipped = self.skipped[kind]
        try:
            f = open(self.path / name, "rb", buffering=1 << 20)
        except FileNotFoundError:
            return
        with f:
            for number, raw in enumerate(f, 1):
                if raw.isspace():
                    continue
                record = self._parse(raw)
                if record is None:
                    skipped.not_json += 1
                elif not isinstance(record, dict):
                    skipped.malformed += 1
                else:
                    yield number, len(raw), record

    def _parse(self, raw: bytes):
        if self._marks and any(m in raw for m in self._marks):
            raw = self._redact(raw.decode("utf-8", "replace")).encode("utf-8")
        try:
            return _fast_loads(raw)
        except ValueError:
            pass
        try:  # orjson refuses lone surrogate escapes and NaN, which json takes
            return json.loads(raw)
        except (ValueError, RecursionError):
            return None


def resolve(output_dir: str, name: str) -> Path:
    """A run named on the command line: a name under --output_dir, or a run directory's own path."""
    if os.sep in name or name.startswith("."):
        return Path(name).expanduser()
    return Path(output_dir) / name
