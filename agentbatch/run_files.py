"""The files of `data/<run_name>/` (README, "Output" and "Resume"): appends, atomic replaces, the resume scan and the merge."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trajectory import VALUE_KINDS, first_human, may_show, shown_kinds, unknown_tools

_BATCH_RE = re.compile(r"^batch_(\d+)\.jsonl$")


def prompt_key(prompt: str) -> bytes:
    """A fixed-size key for a prompt text, so resume memory does not grow with prompt length."""
    return hashlib.blake2b(prompt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


SampleKey = tuple[bytes, int]


def sample_key(line: dict) -> SampleKey | None:
    """(prompt key, sample index) of a trajectory, discard or failure line; lines from before samples are sample 0."""
    prompt = line.get("prompt") if "conversations" not in line else first_human(line)
    if not isinstance(prompt, str):
        return None
    sample = line.get("sample_index")
    return prompt_key(prompt), sample if isinstance(sample, int) and not isinstance(sample, bool) else 0


@dataclass
class MergeReport:
    """What the merge kept and what it filtered out."""

    kept: int = 0
    not_json: int = 0
    unknown_tool: int = 0
    bytes_read: int = 0


class RunFiles:
    """The run directory; the parent process is its only writer."""

    def __init__(self, run_dir: str, secrets: tuple[str, ...] = ()):
        self.dir = run_dir
        # A very short "key" (tests, local servers) would redact ordinary letters out of every line.
        self._secrets = tuple(s for s in secrets if s and len(s) >= 8)
        self._handles: dict[str, object] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def batch_path(self, n: int) -> str:
        return self.path(f"batch_{n}.jsonl")

    def batch_numbers(self) -> list[int]:
        """Existing batch file numbers, ascending."""
        if not os.path.isdir(self.dir):
            return []
        return sorted(int(m.group(1)) for f in os.listdir(self.dir) if (m := _BATCH_RE.match(f)))

    def has_output(self) -> bool:
        return bool(self.batch_numbers()) or any(
            os.path.exists(self.path(n)) for n in ("discarded.jsonl", "failed.jsonl", "checkpoint.json")
        )

    def prepare(self) -> None:
        """Create the directory and cut torn last lines a kill left in the files we append to."""
        os.makedirs(self.dir, exist_ok=True)
        for name in ("failed.jsonl", "discarded.jsonl"):
            _cut_torn_tail(self.path(name))

    def append(self, path: str, obj: dict) -> None:
        """Write one line and flush it, so a kill never loses a finished prompt."""
        line = self.redact(json.dumps(obj, ensure_ascii=False)) + "\n"
        f = self._handles.get(path)
        if f is None:
            # A lone surrogate (a "\ud800" escape from the endpoint) is written back as that JSON escape.
            f = self._handles[path] = open(path, "a", encoding="utf-8", errors="backslashreplace")
        size = os.fstat(f.fileno()).st_size
        try:
            f.write(line)
            f.flush()
        except OSError:
            # Disk full or gone: cut the half-written line, so every line in the file stays whole.
            del self._handles[path]
            with contextlib.suppress(OSError):
                f.close()
            with contextlib.suppress(OSError):
                os.truncate(path, size)
            raise

    def sync(self) -> None:
        """fsync the open files (done at checkpoints, so power loss costs seconds, not hours)."""
        for f in self._handles.values():
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()

    def redact(self, text: str) -> str:
        """Last line of defence: no secret is ever written, whatever a tool or endpoint echoed."""
        for s in self._secrets:
            if s in text:
                text = text.replace(s, "[REDACTED]")
        return text

    def write_json(self, name: str, obj: dict) -> None:
        """Replace a JSON file atomically (write, fsync, rename)."""
        path = self.path(name)
        tmp = path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(self.redact(json.dumps(obj, indent=2, ensure_ascii=False)) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            _remove_quietly(tmp)  # the old file stays as it was; no half-written .tmp is left
            raise

    def read_json(self, name: str) -> dict | None:
        try:
            with open(self.path(name), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def done_counts(self) -> Counter:
        """(prompt key, sample index) → how many finished lines (batch files and discards) answer it."""
        kept, discarded = self.answer_counts()
        return kept + discarded

    def answer_counts(self) -> tuple[Counter, Counter]:
        """(prompt key, sample index) → lines answering it, in the batch files and in discarded.jsonl."""
        kept: Counter = Counter()
        for n in self.batch_numbers():
            _count_prompts(self.batch_path(n), kept, merged_only=True)
        discarded: Counter = Counter()
        _count_prompts(self.path("discarded.jsonl"), discarded)
        return kept, discarded

    def failure_counts(self) -> Counter:
        """(prompt key, sample index) → how many failed attempts failed.jsonl records."""
        failed: Counter = Counter()
        for line in iter_records(self.path("failed.jsonl")):
            if (key := sample_key(line)) is not None:
                failed[key] += 1
        return failed

    def merge(self, on_record: Callable[[dict], None] | None = None) -> MergeReport:
        """Write trajectories.jsonl atomically from every batch file in numeric order, filtering bad entries.

        One exception to the order: a few lead entries are written first, together showing a value of every
        kind the file holds (a tool call, logprobs, a reward...: trajectory.VALUE_KINDS). `datasets` fixes
        the schema from the file's first block, and a kind it has not seen there fails the load.
        """
        report = MergeReport()
        out_path = self.path("trajectories.jsonl")
        tmp = out_path + ".tmp"
        leads = self._lead_entries()
        try:
            self._merge_into(tmp, leads, report, on_record)
            os.replace(tmp, out_path)
        except OSError:
            _remove_quietly(tmp)
            raise
        return report

    def _merge_into(self, tmp: str, leads: dict[tuple[int, int], bytes], report: MergeReport, on_record) -> None:
        with open(tmp, "wb") as out:
            for raw in leads.values():
                out.write(raw)
            for n in self.batch_numbers():
                for i, (raw, record) in enumerate(_iter_lines(self.batch_path(n), report)):
                    if record is None:
                        report.not_json += 1
                    elif unknown_tools(record.get("conversations") or []):
                        report.unknown_tool += 1
                    else:
                        if (n, i) not in leads:
                            out.write(raw if raw.endswith(b"\n") else raw + b"\n")
                        report.kept += 1
                        if on_record:
                            on_record(record)
            out.flush()
            os.fsync(out.fileno())

    def _lead_entries(self) -> dict[tuple[int, int], bytes]:
        """(batch, line position) → line of the first entries the merge keeps that show a kind no earlier one did."""
        leads: dict[tuple[int, int], bytes] = {}
        missing = set(VALUE_KINDS)
        for n in self.batch_numbers():
            for i, raw in enumerate(_iter_raw(self.batch_path(n))):
                if not may_show(raw, missing):
                    continue  # most lines: no JSON parsing
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(record, dict) or unknown_tools(record.get("conversations") or []):
                    continue
                new = shown_kinds(record) & missing
                if new:
                    leads[n, i] = raw if raw.endswith(b"\n") else raw + b"\n"
                    missing -= new
                    if not missing:
                        return leads
        return leads


def _count_prompts(path: str, into: Counter, merged_only: bool = False) -> None:
    for record in iter_records(path):
        # A line the merge drops answers nothing: counting it would leave its prompt out of every output.
        if merged_only and unknown_tools(record.get("conversations") or []):
            continue
        if (key := sample_key(record)) is not None:
            into[key] += 1


def iter_records(path: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file, skipping torn or corrupt lines."""
    for _raw, record in _iter_lines(path, None):
        if record is not None:
            yield record


def _iter_lines(path: str, report: MergeReport | None) -> Iterator[tuple[bytes, dict | None]]:
    for raw in _iter_raw(path, report):
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        yield raw, record if isinstance(record, dict) else None


def _iter_raw(path: str, report: MergeReport | None = None) -> Iterator[bytes]:
    """The non-blank lines of a file, as bytes (a missing file has none)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return
    with f:
        for raw in f:
            if report is not None:
                report.bytes_read += len(raw)
            if raw.strip():
                yield raw


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _cut_torn_tail(path: str) -> None:
    """Drop a last line without its newline (a write cut by a kill), so the next append starts clean."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            pos = size
            while pos > 0:
                step = min(65536, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                i = chunk.rfind(b"\n")
                if i >= 0:
                    f.truncate(pos - step + i + 1)
                    return
                pos -= step
            f.truncate(0)
    except FileNotFoundError:
        pass
