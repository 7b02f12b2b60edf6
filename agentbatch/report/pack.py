"""The report's trajectories: a compact index (one row per line, in columns) that the list is drawn from, and each
line's whole content in gzip chunks of a few hundred kilobytes that the page decodes only when one is opened.

Text is capped (head and tail kept, the cut said in place) so a megabyte of tool output cannot make the page
heavy; the line's file and number say where the whole text is.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
from dataclasses import dataclass, field

from agentbatch.model.usage import cost_of
from agentbatch.report.figures import categories, one_line, seconds_of, tokens_of
from agentbatch.run_dir.reader import Line
from agentbatch.surrogates import scrub_json

try:  # several times faster than json on the payloads, most of the report's writing time
    from orjson import dumps as _fast_dumps
except ImportError:
    _fast_dumps = None

TEXT_CAP = 100_000  # characters of one text kept in a chunk (head and tail)
PREVIEW = 300  # characters of a prompt in the index (the list and the search read these)
REASON = 160  # characters of an error or a discard reason in the index
CHUNK_BYTES = 256 * 1024  # uncompressed JSON per chunk: decoded in a few milliseconds when a trajectory opens
CHUNK_ITEMS = 200
KIND_CODES = {"trajectory": 0, "discarded": 1, "failed": 2}
STATUS_CODES = {"passed": 0, "failed": 1, "timeout": 2, "error": 3, "none": 4}
# Fields of a trajectory line shown by the trajectory view from fields of their own; the rest go in `extra`. A
# dict, not a set: a payload's keys come in this order in every process, so a report is the same byte for byte.
SHOWN = dict.fromkeys((
    "conversations", "check", "usage", "metadata", "completed", "partial", "stop_reason", "api_calls",
    "toolsets_used", "discard_reason", "reward", "passed", "prompt_index", "sample_index", "tools",
    "tool_stats", "tool_error_counts", "identity",
))  # fmt: skip


class Strings:
    """A table of the repeated strings of the index (stop reasons, toolsets, tools, categories, files...)."""

    def __init__(self):
        self.codes: dict[str, int] = {}

    def __call__(self, text: str | None) -> int:
        if text is None:
            return -1
        code = self.codes.get(text)
        if code is None:
            code = self.codes[text] = len(self.codes)
        return code

    def to_list(self) -> list[str]:
        return list(self.codes)


COLUMNS = (
    "run", "kind", "prompt", "pindex", "sample", "status", "reward", "stop", "toolsets", "failed_tools", "tokens", "cost",
    "seconds", "calls", "category", "reason", "file", "line",
)  # fmt: skip


@dataclass
class Index:
    """The columns of every item of the report, the prompt table, and the chunks holding the items' content."""

    strings: Strings = field(default_factory=Strings)
    columns: dict[str, list] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    prompt_ids: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (run, index, text) -> local id
    prompt_rows: list[tuple[int, int | None, str]] = field(default_factory=list)  # local id -> run, index, text
    chunk_starts: list[int] = field(default_factory=list)
    _pending: list[bytes] = field(default_factory=list)
    _pending_bytes: int = 0
    _tools_names: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.columns["run"])

    def add(self, run: int, line: Line) -> bytes | None:
        """Index one line; a chunk's JSON (see compress_chunk) when one fills up with it."""
        r, s, col = line.record, self.strings, self.columns
        failed = line.kind == "failed"
        prompt = r.get("prompt") if failed else r["conversations"][0]["value"]
        prompt = prompt if isinstance(prompt, str) else ""
        index = r.get("prompt_index") if _whole(r.get("prompt_index")) else None
        key = (run, index, prompt)
        pid = self.prompt_ids.get(key)
        if pid is None:
            pid = self.prompt_ids[key] = len(self.prompt_rows)
            self.prompt_rows.append(key)
        check = r.get("check") if isinstance(r.get("check"), dict) else {}
        reward = r.get("reward")
        sample = r.get("sample_index")
        stats = r.get("tool_stats") if isinstance(r.get("tool_stats"), dict) else {}
        failing = sorted(n for n, v in stats.items() if isinstance(v, dict) and v.get("failure"))
        cats = categories(r)
        col["run"].append(run)
        col["kind"].append(KIND_CODES[line.kind])
        col["prompt"].append(pid)
        col["pindex"].append(index)
        col["sample"].append(sample if _whole(sample) else 0)
        status = check.get("status")
        col["status"].append(STATUS_CODES.get(status, 4) if isinstance(status, str) else 4)
        col["reward"].append(reward if _number(reward) else None)
        col["stop"].append(s(r.get("stop_reason") if isinstance(r.get("stop_reason"), str) else None))
        toolsets = r.get("toolsets_used") if isinstance(r.get("toolsets_used"), list) else []
        col["toolsets"].append(s(",".join(str(t) for t in toolsets)))
        col["failed_tools"].append(s(",".join(failing)) if failing else -1)
        col["tokens"].append(tokens_of(r))
        col["cost"].append(round(cost_of(r.get("usage")), 8))
        col["seconds"].append(seconds_of(r))
        col["calls"].append(r.get("api_calls") if _whole(r.get("api_calls")) else 0)
        col["category"].append(s(" · ".join(f"{n}: {v}" for n, v in cats)) if cats else -1)
        reason = r.get("error") if failed else r.get("discard_reason")
        col["reason"].append(one_line(reason, REASON) if reason else None)
        col["file"].append(s(line.file))
        col["line"].append(line.line)
        self._pending.append(_json(self._payload(line)))
        self._pending_bytes += len(self._pending[-1])
        if self._pending_bytes >= CHUNK_BYTES or len(self._pending) >= CHUNK_ITEMS:
            return self.flush()
        return None

    def flush(self) -> bytes:
        """The pending items as one chunk: a JSON array."""
        self.chunk_starts.append(len(self) - len(self._pending))
        body = b"[" + b",".join(self._pending) + b"]"
        self._pending, self._pending_bytes = [], 0
        return body

    def has_pending(self) -> bool:
        return bool(self._pending)

    def _payload(self, line: Line) -> dict:
        """What the trajectory view shows of a line: every field but the tool schemas (their names instead)
        and the zero counts; each text capped."""
        r = line.record
        if line.kind == "failed":
            return _capped(dict(r), line)
        out = {k: r[k] for k in SHOWN if k in r and k not in ("tools", "tool_stats", "tool_error_counts")}
        out["conversations"] = [_turn(t) for t in r["conversations"]]
        stats = r.get("tool_stats") if isinstance(r.get("tool_stats"), dict) else {}
        out["tool_stats"] = {n: v for n, v in stats.items() if isinstance(v, dict) and v.get("count")}
        out["tools_offered"] = self._offered(r.get("tools"))
        extra = {k: v for k, v in r.items() if k not in SHOWN}
        if isinstance(extra.get("tokens"), dict):
            extra["tokens"] = _tokens(extra["tokens"])
        if extra:
            out["extra"] = extra
        return _capped(out, line)

    def _offered(self, tools: object) -> list[str]:
        """The names of the tools a line was offered (its `tools` text is the same few texts all run long)."""
        if not isinstance(tools, str):
            return []
        names = self._tools_names.get(tools)
        if names is None:
            try:
                schemas = json.loads(tools)
            except ValueError:
                schemas = []
            names = [
                str(t["function"].get("name"))
                for t in schemas if isinstance(schemas, list)
                if isinstance(t, dict) and isinstance(t.get("function"), dict)
            ]  # fmt: skip
            if len(self._tools_names) > 256:
                self._tools_names.clear()
            self._tools_names[tools] = names
        return names


def compress_chunk(body: bytes) -> str:
    """A chunk as the page holds it: base64 of its gzip (level 4: within 4 % of level 6's size in 60 % of its
    time; compressing is a third of the report's writing)."""
    return base64.b64encode(gzip.compress(body, compresslevel=4, mtime=0)).decode("ascii")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json(value) -> bytes:
    """UTF-8 JSON of a payload: a lone surrogate (which UTF-8 cannot hold) becomes U+FFFD, NaN and infinities
    (which json.loads reads and JSON has not) null."""
    if _fast_dumps is not None:
        try:
            return _fast_dumps(value)
        except TypeError:  # orjson refuses lone surrogates (and integers beyond 64 bits)
            value = scrub_json(value)
        try:
            return _fast_dumps(value)
        except TypeError:
            pass
    text = json.dumps(scrub_json(value), ensure_ascii=False)
    if "NaN" in text or "Infinity" in text:
        text = json.dumps(json.loads(text, parse_constant=lambda _: None), ensure_ascii=False)
    return text.encode("utf-8")


def _turn(turn: dict) -> dict:
    out = {k: v for k, v in turn.items() if k != "logprobs"}
    logprobs = turn.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        out["logprob_tokens"] = len(logprobs["tokens"])  # the numbers themselves stay in the file
    return out


def _tokens(tokens: dict) -> dict:
    """A line's --token_ids `tokens` as the page shows them: counts and the drift, the ids themselves stay in the file."""
    mask = tokens.get("mask") if isinstance(tokens.get("mask"), list) else []
    ids = tokens.get("ids") if isinstance(tokens.get("ids"), list) else []
    return {
        "source": tokens.get("source"),
        "ids": len(ids),
        "sampled": sum(1 for m in mask if m == 1),
        "calls": tokens.get("calls"),
        "drift": tokens.get("drift"),
    }


def _capped(value, line: Line):
    """The value with every string longer than TEXT_CAP cut to its head and tail, changed in place (the line is
    read once); walks without recursion."""
    if line.size <= TEXT_CAP:  # no text in it can be that long: most lines
        return value
    stack = [value]
    while stack:
        node = stack.pop()
        items = enumerate(node) if isinstance(node, list) else node.items()
        for key, item in items:
            if isinstance(item, str):
                if len(item) > TEXT_CAP:
                    node[key] = _cap(item, line)
            elif isinstance(item, dict | list):
                stack.append(item)
    return value


def _cap(text: str, line: Line) -> str:
    if len(text) <= TEXT_CAP:
        return text
    half = TEXT_CAP // 2
    cut = len(text) - 2 * half
    note = f"\n[… {cut:,} characters not shown here: the whole text is in {line.file}, line {line.line} …]\n"
    return text[:half] + note + text[-half:]
