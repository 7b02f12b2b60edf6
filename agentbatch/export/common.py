"""What every export shares: the run's records read from its files (through run_dir), the filters, dataset cards."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentbatch.run_dir.answers import answer_key
from agentbatch.run_dir.lines import NOT_JSON, ReadCounts, json_value
from agentbatch.run_dir.reader import RunReader
from toolset_distributions import ALL_TOOL_NAMES
from trajectory import first_human, no_check, no_task, with_tool_names


@dataclass(frozen=True)
class Filters:
    """Which trajectories an export keeps (docs/export.md); a record is counted under the first filter that drops it."""

    completed_only: bool = False
    no_partial: bool = False
    no_tool_errors: bool = False
    min_turns: int = 0
    toolsets: tuple[str, ...] = ()
    passed_only: bool = False

    def rejects(self, record: dict) -> str | None:
        """The name of the filter that drops this record, or None when it is kept."""
        if self.completed_only and record.get("completed") is not True:
            return "not_completed"
        if self.no_partial and record.get("partial"):
            return "partial"
        if self.no_tool_errors and tool_errors(record):
            return "tool_errors"
        if self.min_turns and assistant_turns(record) < self.min_turns:
            return "too_few_turns"
        if self.toolsets and not set(self.toolsets) <= set(record.get("toolsets_used") or ()):
            return "toolsets"
        if self.passed_only and record.get("passed") is not True:
            return "not_passed" if record.get("passed") is False else "no_verdict"
        return None

    def describe(self) -> dict:
        return {
            "completed_only": self.completed_only,
            "no_partial": self.no_partial,
            "no_tool_errors": self.no_tool_errors,
            "min_turns": self.min_turns,
            "toolsets": list(self.toolsets),
            "passed_only": self.passed_only,
        }


def tool_errors(record: dict) -> int:
    counts = record.get("tool_error_counts") or {}
    return sum(int(v or 0) for v in counts.values()) if isinstance(counts, dict) else 0


def assistant_turns(record: dict) -> int:
    return sum(1 for t in record.get("conversations") or () if t.get("from") == "gpt")


@dataclass
class SourceCounts(ReadCounts):
    """What reading the run's batch files found before any filter (run_dir's counts), and what each filter dropped."""

    filtered: Counter = field(default_factory=Counter)


class RunSource:
    """The records of a run directory, read through run_dir's reader and never changed (so a live or killed run
    works): the lines that count, as the merge counts them, each redacted of the given secrets before it is
    parsed, whatever the files already hold."""

    def __init__(self, run_dir: str | Path, secrets: tuple[str, ...] = ()):
        self.dir = Path(run_dir)
        self.reader = RunReader(run_dir, secrets)
        self.paths = self.reader.paths
        self.counts = SourceCounts()
        # The run's tools (tools.json; the built-ins for a run from before it was kept): the merge keeps a line
        # that calls only these, and every line has their entries in tool_stats and tool_error_counts.
        self.tool_set, self.tool_names = self.reader.tool_set, self.reader.tool_names

    def exists(self) -> bool:
        return self.reader.exists()

    def trajectories(self) -> Iterator[tuple[dict, bytes]]:
        """(record, its redacted line) of every trajectory the merge would keep, in batch-file order; the lines
        left out are counted."""
        for line in self.reader.trajectories(self.counts, parse_value):
            yield with_tool_names(line.record, self.tool_names), line.raw

    def discarded(self) -> Iterator[dict]:
        for line in self.reader.discards(parse=parse_value):
            yield line.record

    def unanswered_failures(self) -> list[dict]:
        """The last failed attempt of each row that no trajectory or discard answers, with its attempt count.

        Matched as resume matches (run_dir/answers.py): a failure that carries its row's identity is answered
        by a line of that identity, an older one by any line of its prompt text.
        """
        identities, prompts = set(), set()
        for line in (*self.reader.trajectories(parse=parse_value), *self.reader.discards(parse=parse_value)):
            key = answer_key(line.record)
            if key is not None and isinstance(key[0], str):
                identities.add(key[0])
            prompts.add(first_human(line.record))
        last: dict[str | bytes, dict] = {}
        attempts: Counter = Counter()
        for line in (x.record for x in self.reader.failures(parse=parse_value)):
            key = answer_key(line)
            if key is None or (key[0] in identities if isinstance(key[0], str) else line["prompt"] in prompts):
                continue
            last[key[0]] = line
            attempts[key[0]] += 1
        return [dict(line, attempts=attempts[k]) for k, line in last.items()]

    def read_json(self, name: str) -> dict:
        return self.reader.read_json(name)

    def line_blocks(self, block_bytes: int) -> Iterator[tuple[list[bytes], list[int]]]:
        """The batch files' lines, unparsed and redacted, in blocks of about block_bytes (RunReader.blocks): the
        caller applies the rule (record_shape.why_skipped) and counts what it leaves out."""
        return self.reader.blocks(self.counts, block_bytes)


def parse_value(raw: bytes) -> object:
    """A line's JSON value as run_dir reads it (lines.json_value: NOT_JSON when it is not JSON), each lone
    surrogate a "?": Arrow, pydantic and Inspect cannot write it as UTF-8."""
    value = json_value(raw)
    if value is not NOT_JSON and (b"\\ud" in raw or b"\\uD" in raw):
        value = json.loads(json.dumps(value, ensure_ascii=False).encode("utf-8", "replace"))
    return value


def parse_line(raw: bytes) -> dict | None:
    """The line's JSON object, None for a torn or corrupt line (or one that holds another JSON value)."""
    value = parse_value(raw)
    return value if type(value) is dict else None


def parse_json(raw: bytes):
    """A JSON value, as parse_value reads it; ValueError when it is not JSON."""
    value = parse_value(raw)
    if value is NOT_JSON:
        raise ValueError("not JSON")
    return value


def parse_text(text: str):
    """A JSON value a record holds as text (a call's arguments, a tool's result, the offered tools), read as
    parse_json reads a line, so a lone surrogate its escapes decode to becomes "?" here too; ValueError if not JSON."""
    return parse_json(text.encode("utf-8", "replace"))


@dataclass
class ExportContext:
    """What a format writer knows about the run besides its records."""

    run_name: str
    run_dir: Path
    checkpoint: dict
    statistics: dict
    filters: Filters
    tool_names: tuple[str, ...] = ALL_TOOL_NAMES  # the run's tools (tools.json): the built-ins and its own


class FormatWriter(ABC):
    """One export format, written into the folder `out` (swapped in whole once finish() returns).

    Records go in one at a time (add, with the line as read); finish() writes what is left and returns its
    counts for export/report.json. Two capabilities a format may declare: `reads_lines`, it reads the batch
    files' lines itself, a block at a time (add_lines: faster than parsing each line here; used when it is
    the only format asked for), and `takes_all_outcomes`, it is also given the discarded lines and the last
    failed attempt of each prompt nothing answers (a viewer's log shows every sample).
    """

    reads_lines = False
    takes_all_outcomes = False
    BLOCK_BYTES = 0  # with reads_lines: the bytes of lines in one block

    def __init__(self, out: Path, ctx: ExportContext):
        self.out, self.ctx = out, ctx

    @abstractmethod
    def add(self, record: dict, raw: bytes = b"") -> None: ...

    @abstractmethod
    def finish(self) -> dict[str, Any]: ...

    def add_lines(self, blocks: Iterator[tuple[list[bytes], list[int]]], filters: Filters, counts: ReadCounts) -> int:
        """With reads_lines: every line of the blocks, filtered here; how many were kept."""
        raise TypeError(f"{type(self).__name__} does not read lines itself")

    def add_discarded(self, line: dict) -> None:
        """With takes_all_outcomes: a line of discarded.jsonl."""
        raise TypeError(f"{type(self).__name__} does not take discarded lines")

    def add_failed(self, line: dict) -> None:
        """With takes_all_outcomes: the last failed attempt of a prompt no line answers."""
        raise TypeError(f"{type(self).__name__} does not take failed attempts")


class JsonlWriter(FormatWriter):
    """A format of one JSON line per trajectory in `file` plus its dataset card. A format is data: its
    `features`, how a record becomes a line (`to_line`, a staticmethod) and its card's text (`card_text`, with
    {run_name}, {written} and {file} filled in)."""

    file = "data.jsonl"
    features = ""
    card_text = ""
    to_line: Callable[[dict], dict]

    def __init__(self, out: Path, ctx: ExportContext):
        super().__init__(out, ctx)
        self.f = open(out / self.file, "w", encoding="utf-8", errors="backslashreplace")
        self.written = 0

    def card(self) -> str:
        return self.card_text.format(run_name=self.ctx.run_name, written=self.written, file=self.file)

    def add(self, record: dict, raw: bytes = b"") -> None:
        self.write(self.to_line(record))

    def write(self, line: dict) -> None:
        write_jsonl_line(self.f, line)
        self.written += 1

    def finish(self) -> dict:
        self.f.close()
        write_card(self.out / "README.md", self.features, self.file, self.card())
        return {"written": self.written}


def split_arguments(arguments: Any) -> tuple[dict, str | None]:
    """(arguments as an object, the raw text when they are not a JSON object): for formats that require an object."""
    if isinstance(arguments, dict):
        return arguments, None
    try:
        parsed = parse_text(arguments) if isinstance(arguments, str) else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return parsed, None
    return {}, arguments if isinstance(arguments, str) else json.dumps(arguments)


def parsed_tools(record: dict) -> list[dict]:
    """The function schemas the model was offered ({"type": "function", "function": {...}} each)."""
    tools = record.get("tools")
    if isinstance(tools, str):
        try:
            tools = parse_text(tools)
        except ValueError:
            return []
    return [t for t in tools or () if isinstance(t, dict)]


def outcome(record: dict) -> dict:
    """The line's `sample_index`, `reward`, `passed`, `check` and `task` as written, with the neutral values of
    lines written before them (sample 0, no check, no Harbor task), so every exported line has all five."""
    sample = record.get("sample_index")
    fields = {"sample_index": sample if isinstance(sample, int) and not isinstance(sample, bool) else 0}
    fields.update(no_check())
    fields.update({k: record[k] for k in ("reward", "passed", "check") if k in record})
    fields["task"] = record["task"] if isinstance(record.get("task"), dict) else no_task()
    return fields


def turn_logprobs(turn: dict) -> dict | None:
    """A gpt turn's `{"tokens", "logprobs", "token_ids"}` (docs/verified-outcomes.md, "Token log probabilities"), None without them."""
    logprobs = turn.get("logprobs")
    return logprobs if isinstance(logprobs, dict) else None


def outcome_text(record: dict, model_turns: list[dict]) -> str:
    """The `extra` field of formats whose loaders type columns from the first lines they read (LLaMA-Factory's,
    the original agent's): the outcome and, when any model turn has them, each one's logprobs, as JSON text.

    Text is one type on every line, where a reward first seen after a block of nulls would fail such a load.
    """
    fields = {k: v for k, v in outcome(record).items() if k != "sample_index"}
    logprobs = [turn_logprobs(t) for t in model_turns]
    if any(logprobs):
        fields["logprobs"] = logprobs
    return json.dumps(fields, ensure_ascii=False)


def write_jsonl_line(f, obj: dict) -> None:
    f.write(json.dumps(obj, ensure_ascii=False))
    f.write("\n")


def write_card(path: Path, features_yaml: str, data_files: str, body: str) -> None:
    """A README.md whose YAML header gives the schema, so `datasets.load_dataset(DIR)` loads any mix of lines.

    `datasets` caches a folder whose card names its data files by the folder's name and the card's header alone,
    never looking at the files: a re-export (or another run's export in a folder of the same name) would load
    the rows cached before. So the config's `description` carries a digest of the files written, which enters
    that cache key: other rows are another cache entry.
    """
    header = f"---\ndataset_info:\n  features:\n{features_yaml}" if features_yaml else "---\n"
    header += "configs:\n- config_name: default\n  data_files:\n"
    header += f"  - split: train\n    path: {data_files}\n"
    header += f'  description: "batch-runner export, files {files_fingerprint(path.parent, data_files)}"\n---\n\n'
    path.write_text(header + body, encoding="utf-8")


def files_fingerprint(folder: Path, pattern: str) -> str:
    """A digest of the names and contents of the files the pattern matches (sha256; a few % of an export's time)."""
    digest = hashlib.sha256()
    for file in sorted(folder.glob(pattern)):
        with open(file, "rb") as f:
            content = hashlib.file_digest(f, "sha256").hexdigest()
        digest.update(f"{file.relative_to(folder).as_posix()}\0{content}\n".encode())
    return "sha256:" + digest.hexdigest()
