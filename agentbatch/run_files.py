"""The files of `data/<run_name>/` (README, "Output" and "Resume"): appends, atomic replaces, the resume scan and the merge."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import socket
import types
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agentbatch.errors import FatalError
from agentbatch.record_shape import trajectory_problem
from agentbatch.secrets_guard import Redactor
from agentbatch.surrogates import has_escaped_surrogate, scrub, scrub_json
from trajectory import VALUE_KINDS, first_human, may_show, shown_kinds, unknown_tools

_BATCH_RE = re.compile(r"^batch_(\d+)\.jsonl$")
LOCK_NAME = "session.lock"


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
    malformed: int = 0  # valid JSON of another shape than a trajectory line (record_shape.py)
    unknown_tool: int = 0
    bytes_read: int = 0


class RunFiles:
    """The run directory; the parent process is its only writer."""

    def __init__(self, run_dir: str, secrets: tuple[str, ...] = ()):
        self.dir = run_dir
        self.redact = Redactor(secrets)
        self._handles: dict[str, object] = {}
        self._lock_fd: int | None = None
        # Path → offset → length of the lines this session appended and its caller
        # accounted for: the merge copies them as they are instead of reading each back (see append).
        self._accounted: dict[str, dict[int, int]] = {}
        # Path → VALUE_KINDS → offset of the first accounted line there showing it: what the merge's search
        # for lead entries would find in a file this session wrote alone, known without reading it.
        self._kind_lines: dict[str, dict[str, int]] = {}

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

    def lock(self, session: str, started: str) -> None:
        """Hold the run directory for this session until it ends: a second session is refused with one line.

        An exclusive flock on session.lock: the kernel drops it when the holder exits, however it dies
        (kill -9, OOM, power loss), so a stale file never blocks a resume. The file says who holds it.
        Raises FatalError when another live session holds it, OSError when the directory is unusable.
        """
        os.makedirs(self.dir, exist_ok=True)
        fd = os.open(self.path(LOCK_NAME), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise FatalError(
                f"{self.dir} is in use by another session{holder}; wait for it to end (or stop it), "
                "then run again with --resume"
            ) from None
        except OSError:
            os.close(fd)
            raise
        info = {"session": session, "pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Let the run directory go (the file stays: what it says is only read while someone holds it)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def prepare(self) -> None:
        """Create the directory and cut torn last lines a kill left in the files we append to."""
        os.makedirs(self.dir, exist_ok=True)
        for name in ("failed.jsonl", "discarded.jsonl"):
            _cut_torn_tail(self.path(name))

    def append(self, path: str, obj: dict, kept: bool = False) -> bool:
        """Write one line and flush it, so a kill never loses a finished prompt.

        With `kept` (a trajectory for a batch file), returns True when the line is `obj` exactly as the merge
        would read it back and keep it: the caller then counts it in the merge's statistics itself, and the
        merge copies the line without parsing it (a merge of this session's lines was ~0.2 ms a line).
        """
        text = _dumps(obj)
        written = scrub(self.redact(text))  # see _text
        line = written + "\n"
        f = self._handles.get(path)
        if f is None:
            f = self._handles[path] = open(path, "a", encoding="utf-8")
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
        # A redacted line, one with a lone surrogate (written as U+FFFD), or one the merge filters is read back
        # like any other.
        if (
            not kept
            or written is not text
            or trajectory_problem(obj) is not None
            or unknown_tools(obj["conversations"])
        ):
            return False
        length = os.fstat(f.fileno()).st_size - size
        self._accounted.setdefault(path, {})[size] = length
        firsts = self._kind_lines.setdefault(path, {})
        if len(firsts) < len(VALUE_KINDS):
            for kind in shown_kinds(obj).difference(firsts):
                firsts[kind] = size
        return True

    def sync(self) -> None:
        """fsync the open files (done at checkpoints, so power loss costs seconds, not hours)."""
        for f in self._handles.values():
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()

    def _text(self, obj: dict, indent: int | None) -> str:
        """A line as written: no secret, whatever a tool or endpoint echoed, and no lone surrogate, which
        UTF-8 cannot hold and whose JSON escape would make the whole file unloadable in `datasets`."""
        return scrub(self.redact(json.dumps(obj, indent=indent, ensure_ascii=False)))

    def write_json(self, name: str, obj: dict) -> None:
        """Replace a JSON file atomically (write, fsync, rename)."""
        path = self.path(name)
        tmp = path + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(self._text(obj, 2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            _remove_quietly(tmp)  # the old file stays as it was; no half-written .tmp is left
            raise

    def read_json(self, name: str) -> dict | None:
        """A JSON object file; None if it is missing, unreadable or anything but an object."""
        try:
            with open(self.path(name), encoding="utf-8") as f:
                value = json.load(f)
        except (OSError, ValueError, RecursionError):
            return None
        return value if isinstance(value, dict) else None

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

    def discarded_records(self) -> Iterator[dict]:
        """The lines of discarded.jsonl that are trajectory-shaped (others answer nothing and count nowhere)."""
        for record in iter_records(self.path("discarded.jsonl")):
            if trajectory_problem(record) is None:
                yield record

    def merge(self, on_record: Callable[[dict], None] | None = None) -> MergeReport:
        """Write trajectories.jsonl atomically from every batch file in numeric order, filtering bad entries.

        One exception to the order: a few lead entries are written first, together showing a value of every
        kind the file holds (a tool call, logprobs, a reward...: trajectory.VALUE_KINDS). `datasets` fixes
        the schema from the file's first block, and a kind it has not seen there fails the load. They are
        taken from the newest batches first, whose lines carry every field a line can have (a resumed run
        may begin with lines written before a field was added).
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

    def _merge_into(self, tmp: str, leads: dict[tuple[str, int], bytes], report: MergeReport, on_record) -> None:
        with open(tmp, "wb", buffering=1 << 20) as out:
            for raw in leads.values():
                out.write(raw)
            for n in self.batch_numbers():
                path = self.batch_path(n)
                for offset, raw, record in _lines(path, report, self._accounted.get(path)):
                    if record is ACCOUNTED:  # written by this session, checked when it was (see append)
                        line = raw
                    elif record is NOT_JSON:
                        report.not_json += 1
                        continue
                    elif trajectory_problem(record) is not None:
                        report.malformed += 1
                        continue
                    elif unknown_tools(record["conversations"]):
                        report.unknown_tool += 1
                        continue
                    else:
                        line = _merged_line(raw, record)
                        if on_record:
                            on_record(record)
                    if (path, offset) not in leads:
                        out.write(line if line.endswith(b"\n") else line + b"\n")
                    report.kept += 1
            out.flush()
            os.fsync(out.fileno())

    def _lead_entries(self) -> dict[tuple[str, int], bytes]:
        """(batch path, offset) → line of the entries the merge keeps that show a kind no other lead did.

        A batch file this session wrote alone is not read: append noted where each kind first shows in it,
        so a run whose lines never show some kind (no logprobs, no checks) does not read every file twice.
        """
        leads: dict[tuple[str, int], bytes] = {}
        missing = set(VALUE_KINDS)
        for n in reversed(self.batch_numbers()):
            path = self.batch_path(n)
            accounted = self._accounted.get(path)
            if accounted and sum(accounted.values()) == _size(path):
                missing -= self._known_leads(path, accounted, missing, leads)
                if not missing:
                    return leads
                continue
            for offset, raw, _ in _lines(path, None, None, parse=False):
                if not may_show(raw, missing):
                    continue  # most lines: no JSON parsing
                try:
                    record = json.loads(raw)
                except (ValueError, RecursionError):
                    continue
                if trajectory_problem(record) is not None or unknown_tools(record["conversations"]):
                    continue
                new = shown_kinds(record) & missing
                if new:
                    line = _merged_line(raw, record)
                    leads[path, offset] = line if line.endswith(b"\n") else line + b"\n"
                    missing -= new
                    if not missing:
                        return leads
        return leads

    def _known_leads(self, path: str, accounted: dict[int, int], missing: set[str], leads: dict) -> set[str]:
        """The leads a search of `path` (every line this session's) would take, from append's notes; their kinds."""
        firsts = {kind: offset for kind, offset in self._kind_lines.get(path, {}).items() if kind in missing}
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


def _merged_line(raw: bytes, record: dict) -> bytes:
    """A kept line as trajectories.jsonl gets it: as written, unless it holds a lone surrogate (older versions
    wrote them as JSON escapes, which make the whole file unloadable), then rewritten without."""
    if has_escaped_surrogate(raw):
        return (json.dumps(scrub_json(record), ensure_ascii=False) + "\n").encode("utf-8")
    return raw if raw.endswith(b"\n") else raw + b"\n"


def _count_prompts(path: str, into: Counter, merged_only: bool = False) -> None:
    for record in iter_records(path):
        # A line the merge drops answers nothing: counting it would leave its prompt out of every output.
        if trajectory_problem(record) is not None:
            continue
        if merged_only and unknown_tools(record["conversations"]):
            continue
        if (key := sample_key(record)) is not None:
            into[key] += 1


def iter_records(path: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file, skipping torn or corrupt lines and JSON of another kind."""
    for _raw, record in _iter_lines(path, None):
        if isinstance(record, dict):
            yield record


def _dumps(obj: dict) -> str:
    """json.dumps(obj, ensure_ascii=False), with a trailing `tools` text (a trajectory's schemas) escaped once."""
    tools = obj.get("tools")
    if not isinstance(tools, str) or next(reversed(obj)) != "tools":
        return json.dumps(obj, ensure_ascii=False)
    # The schemas are ~80 % of a trajectory line and one of a few texts per run: escaping them again for
    # every line was most of the runner's own time per prompt.
    token = _tools_tokens.get(tools)
    if token is None:
        if len(_tools_tokens) >= 256:
            _tools_tokens.clear()
        token = _tools_tokens[tools] = json.dumps(tools, ensure_ascii=False)
    rest = json.dumps({k: v for k, v in obj.items() if k != "tools"}, ensure_ascii=False)
    return f'{rest[:-1]}, "tools": {token}}}' if len(rest) > 2 else f'{{"tools": {token}}}'


_tools_tokens: dict[str, str] = {}


# Stands for the record of a line this session wrote and its caller accounted for: it is not parsed again.
ACCOUNTED = types.MappingProxyType({})


NOT_JSON = object()  # what _lines yields for a line that does not parse


def _iter_lines(path: str, report: MergeReport | None, accounted=None) -> Iterator[tuple[bytes, object]]:
    for _offset, raw, record in _lines(path, report, accounted):
        yield raw, record


def _lines(
    path: str, report: MergeReport | None, accounted=None, parse: bool = True
) -> Iterator[tuple[int, bytes, object]]:
    """(offset, line, parsed value or NOT_JSON) of every non-blank line; ACCOUNTED lines (and all without
    `parse`, then yielded with None) are not parsed."""
    try:
        f = open(path, "rb", buffering=1 << 20)  # lines of ~10 KB: a default 8 KB buffer reads each in pieces
    except FileNotFoundError:
        return
    offset = 0
    with f:
        for raw in f:
            at, offset = offset, offset + len(raw)
            if report is not None:
                report.bytes_read += len(raw)
            if not raw.strip():
                continue
            if not parse:
                yield at, raw, None
                continue
            if accounted is not None and accounted.get(at) == len(raw):
                yield at, raw, ACCOUNTED
                continue
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):  # not JSON, or nested past any sane depth
                record = NOT_JSON
            yield at, raw, record


def _lock_holder(fd: int) -> str:
    """' (pid N on HOST, started T)' from a held lock file; empty if it cannot be read yet."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return ""
    if not isinstance(info, dict):
        return ""
    return f" (pid {info.get('pid')} on {info.get('host')}, started {info.get('started')})"


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
