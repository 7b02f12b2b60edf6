"""A block of lines read once for the `parquet` export: Arrow's JSON reader types each line it can, and a key scan
finds what the reader leaves out (fields outside the schema, keys that change a statistic) without a full parse.

The scan uses msgspec (`batch-runner[export]`) to list a line's keys and keep their values as raw JSON: only
the values of extra fields are parsed. Without msgspec, or for a line the scan cannot vouch for, the caller
parses the whole line in Python (`Scan.python`). The scan also finds what of the run's rule for which lines
count (record_shape.trajectory_problem) Arrow's columns cannot show: a null where the rule takes only a missing
field (Arrow reads both as null), and the types of `identity` and `discard_reason`, which are no columns; such
a line goes to Python, where the rule itself decides. The rest of the rule is on the columns
(parquet_columns.malformed).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as paj

from agentbatch.export.common import parse_json
from agentbatch.export.parquet_rows import COLUMNS, TOKENS, TURN_KEYS, USAGE_KEYS, Layout

try:
    import msgspec
except ImportError:  # the scan then vouches for no line: every line is parsed in Python, as fast as before it
    msgspec = None

_KNOWN = COLUMNS | {"conversations"}


@dataclass
class Block:
    """Lines, and for each the row Arrow typed it as in `table` (-1: a line Arrow's reader cannot type)."""

    lines: list[bytes]
    sizes: list[int]  # bytes of each line as read (the row groups are cut on these)
    table: pa.Table | None = None
    row: list[int] = field(default_factory=list)


def read_block(lines: list[bytes], sizes: list[int], run: Layout) -> Block:
    """Type every line Arrow's reader can: the whole block at once, halves of it around lines it cannot."""
    block = Block(lines, sizes, row=[-1] * len(lines))
    tables: list[pa.Table] = []
    parse = paj.ParseOptions(explicit_schema=run.json_schema, unexpected_field_behavior="ignore")
    _read(block, 0, len(lines), tables, parse)
    if tables:
        block.table = pa.concat_tables(tables).combine_chunks() if len(tables) > 1 else tables[0]
    return block


def _read(block: Block, lo: int, hi: int, tables: list[pa.Table], parse: paj.ParseOptions) -> None:
    # Arrow's reader crashes the process (SIGSEGV, pyarrow 26) on data whose first value is `null`: lines that
    # begin with anything but an object are no rows of it, and are left for Python.
    while lo < hi and not block.lines[lo].lstrip().startswith(b"{"):
        lo += 1
    if lo == hi:
        return
    data = b"".join(block.lines[lo:hi])
    table = None
    # Arrow's reader keeps bytes that are not UTF-8 as they are, where Python's JSON parser refuses the line.
    if data.isascii() or _utf8(data):
        try:
            # One block per call: half the CPU of letting the reader cut it into several (measured).
            table = paj.read_json(io.BytesIO(data), paj.ReadOptions(block_size=len(data) + 1), parse)
        except pa.ArrowInvalid:
            pass
    if table is None or table.num_rows != hi - lo:  # a line Arrow cannot type (or two objects on one line)
        if hi - lo > 1:
            mid = (lo + hi) // 2
            _read(block, lo, mid, tables, parse)
            _read(block, mid, hi, tables, parse)
        return
    conv = table.column("conversations").combine_chunks()
    bad = conv.is_null().to_numpy(zero_copy_only=False)
    turns = conv.flatten()
    if turns.null_count:  # a turn that is null: not a line Arrow's columns can carry
        parents = pc.list_parent_indices(conv).to_numpy()
        bad[parents[turns.is_null().to_numpy(zero_copy_only=False)]] = True
    if bad.any():
        table = table.filter(pa.array(~bad))
    start = sum(t.num_rows for t in tables)
    for k, i in enumerate(np.flatnonzero(~bad).tolist()):
        block.row[lo + i] = start + k
    tables.append(table)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class Scan:
    """What a typed line holds beyond Arrow's columns."""

    extra: str | None = None
    turn_extras: list[str | None] = field(default_factory=list)
    python: bool = False  # parse this line in Python for its filters, statistics and extras


_PYTHON = Scan(python=True)


if msgspec is not None:
    _Raw = msgspec.Raw

    class _Turn(msgspec.Struct, forbid_unknown_fields=True):
        """A turn with no field beyond TURN's (values kept raw, never parsed)."""

        from_: _Raw = msgspec.field(name="from", default=_Raw())
        value: _Raw = _Raw()
        tool_calls: _Raw = _Raw()
        tool_call_id: _Raw = _Raw()
        name: _Raw = _Raw()
        logprobs: _Raw = _Raw()  # beyond TURN's, on lines of --logprobs runs: its only extra field when present

    # The fields whose null the rule refuses (an absent one it takes) are typed here without null: a line holding
    # such a null fails this decoding and goes to the slower key scan, which sends it to Python.
    class _Usage(msgspec.Struct, forbid_unknown_fields=True):
        prompt_tokens: int = 0
        completion_tokens: int = 0
        total_tokens: int = 0
        cost: _Raw = _Raw()

    class _Counts(msgspec.Struct):
        count: int = 0
        success: int = 0
        failure: int = 0

    class _Line(msgspec.Struct, forbid_unknown_fields=True):
        """A line with no field beyond the schema's: one pass over it, nothing parsed but the keys."""

        conversations: list[_Turn] = []
        usage: _Usage | msgspec.UnsetType = msgspec.UNSET
        tool_stats: dict[str, _Counts] = {}
        tool_error_counts: dict[str, int] = {}
        prompt_index: int = 0
        sample_index: int = 0
        metadata: dict[str, _Raw] = {}
        task: _Raw = _Raw()
        completed: bool = False
        partial: bool = False
        stop_reason: _Raw = _Raw()
        api_calls: int = 0
        toolsets_used: list[str | None] = []
        tools: _Raw = _Raw()
        reward: _Raw = _Raw()
        passed: _Raw = _Raw()
        # Beyond the schema's, on every line of a current run: its only extra fields, in this order.
        identity: _Raw = _Raw()
        check: _Raw = _Raw()
        duration_seconds: _Raw = _Raw()

    _LINE = msgspec.json.Decoder(_Line)
    _OBJECT = msgspec.json.Decoder(dict[str, _Raw] | None)
    _TURNS = msgspec.json.Decoder(list[dict[str, _Raw]])


def scan(line: bytes, run: Layout) -> Scan:
    """The extra fields of a line Arrow typed, found by listing its keys (values stay raw JSON unless extra)."""
    if msgspec is None:
        return _PYTHON
    try:
        known = _LINE.decode(line)
    except msgspec.ValidationError:  # a field beyond the schema's somewhere (Arrow typed the rest)
        return _scan_keys(line, run)
    except msgspec.DecodeError:
        return _PYTHON
    if known.identity and not _text_or_null(known.identity):
        return _PYTHON  # the rule refuses it: record_shape decides
    if known.tool_stats and not _in_run_order(known.tool_stats, run):
        return _PYTHON  # the card's tool-call counts follow a line's own key order and count every key
    if known.tool_error_counts and not known.tool_error_counts.keys() <= run.known:
        return _PYTHON  # --export_no_tool_errors sums every key
    try:
        extra = _extra_text("check", known.check)
        if known.duration_seconds:  # a different number on every line: not kept, put after the check's
            duration = f'"duration_seconds": {json.dumps(_value(known.duration_seconds))}'
            extra = f"{extra[:-1]}, {duration}}}" if extra else f"{{{duration}}}"
        if known.identity:  # a different text on every line: not kept, put before the check's
            identity = f'"identity": {json.dumps(_value(known.identity), ensure_ascii=False)}'
            extra = f"{{{identity}, {extra[1:]}" if extra else f"{{{identity}}}"
        turns = [_extra_text("logprobs", t.logprobs) for t in known.conversations]
    except ValueError:
        return _PYTHON
    return Scan(extra=extra, turn_extras=turns)


_TEXTS: dict[tuple[str, bytes], str] = {}  # the same small values recur line after line (a line without a check)


def _extra_text(key: str, raw) -> str | None:
    """`{key: value}` as the extra column's JSON text, None when the field is absent (an empty Raw)."""
    if not raw:
        return None
    if len(raw) > 256:  # large and seldom repeated (logprobs): not worth keeping
        return _dumps({key: _value(raw)})
    data = bytes(raw)
    text = _TEXTS.get((key, data))
    if text is None:
        if len(_TEXTS) > 1024:
            _TEXTS.clear()
        text = _TEXTS[key, data] = _dumps({key: _value(data)})
    return text


def _scan_keys(line: bytes, run: Layout) -> Scan:
    try:
        top = _OBJECT.decode(line)
        turns = _TURNS.decode(top["conversations"])
        usage = _OBJECT.decode(top["usage"]) if "usage" in top else None
        stats = _OBJECT.decode(top["tool_stats"]) if "tool_stats" in top else None
        errors = _OBJECT.decode(top["tool_error_counts"]) if "tool_error_counts" in top else None
    except (msgspec.DecodeError, KeyError, TypeError):
        return _PYTHON
    if _refused_null(top, usage, stats, errors):
        return _PYTHON  # not a trajectory by the rule, which Arrow's columns cannot show: record_shape decides
    if stats and not _in_run_order(stats, run):
        return _PYTHON
    if errors and not errors.keys() <= run.known:
        return _PYTHON
    if usage and "cost" not in usage and "cost_usd" in usage:
        return _PYTHON  # the card's cost falls back to cost_usd
    try:
        extra = {k: _value(v) for k, v in top.items() if k not in _KNOWN} if top.keys() - _KNOWN else {}
        if usage and usage.keys() - USAGE_KEYS:
            extra["usage"] = {k: _value(v) for k, v in usage.items() if k not in USAGE_KEYS}
        out = Scan(extra=_dumps(extra))
        for t in turns:
            more = t.keys() - TURN_KEYS
            out.turn_extras.append(_dumps({k: _value(v) for k, v in t.items() if k in more}) if more else None)
    except ValueError:
        return _PYTHON
    return out


# Fields the rule takes absent but refuses as null (record_shape.trajectory_problem); Arrow reads both as null.
_NOT_NULL = ("completed", "partial", "prompt_index", "api_calls", "sample_index", "metadata", "toolsets_used")
_NOT_NULL_OBJECTS = ("usage", "tool_stats", "tool_error_counts")
_NULL = b"null"


def _refused_null(top: dict, usage: dict | None, stats: dict | None, errors: dict | None) -> bool:
    """Whether the line holds what the rule refuses and the columns cannot show: a null in place of a field the
    rule takes only absent, or an `identity` or `discard_reason` that is neither text nor null."""
    if any(bytes(top[k]) == _NULL for k in (*_NOT_NULL, *_NOT_NULL_OBJECTS) if k in top):
        return True
    if any(not _text_or_null(top[k]) for k in ("identity", "discard_reason") if k in top):
        return True
    if usage and any(bytes(usage[k]) == _NULL for k in TOKENS if k in usage):
        return True
    if stats and any(_NULL in bytes(v) for v in stats.values()):  # a count's null, or the entry's
        return True
    return bool(errors) and any(bytes(v) == _NULL for v in errors.values())


def _text_or_null(raw) -> bool:
    data = bytes(raw)
    return data[:1] == b'"' or data == _NULL


def _in_run_order(keys: dict, run: Layout) -> bool:
    if len(keys) == len(run.names) and tuple(keys) == run.names:
        return True
    order = [run.order.get(k, -1) for k in keys]
    return -1 not in order and order == sorted(order)


def _value(raw) -> object:
    return parse_json(bytes(raw))


def _dumps(obj: dict) -> str | None:
    return json.dumps(obj, ensure_ascii=False) if obj else None
