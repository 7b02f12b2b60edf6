"""The rows of the `parquet` export: its schema, and a batch of lines → one table of it.

The schema is the run's (`layout(names)`): `tool_stats` and `tool_error_counts` have a field for each of its
tools, the built-ins and its own (tool_set.py). A line's own fields are columns, `reward` / `passed` / `usage.cost` null where a line has none, and whatever
else a line or a turn carries (the `check` object, logprobs, fields added later) is JSON text in `extra`.
Lines Arrow's JSON reader types with the layout's json_schema become rows from its columns (`typed_rows`); a row group
holding any line it cannot type is built row by row from the parsed lines instead (`python_rows`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

import pyarrow as pa
import pyarrow.compute as pc

from toolset_distributions import ALL_TOOL_NAMES

_s = pa.string()
_i = pa.int64()
TOOL_CALL = pa.struct([("id", _s), ("name", _s), ("arguments", _s)])
TURN = pa.struct(
    [
        ("from", _s),
        ("value", _s),
        ("tool_calls", pa.list_(TOOL_CALL)),
        ("tool_call_id", _s),
        ("name", _s),
        ("extra", _s),
    ]
)
_STATS = pa.struct([("count", _i), ("success", _i), ("failure", _i)])


@dataclass(frozen=True)
class Layout:
    """The Parquet schema of a run with these tools, and what the line readers need to know of them."""

    names: tuple[str, ...]
    schema: pa.Schema
    json_schema: pa.Schema  # what Arrow's own JSON reader parses straight from the lines: no `extra` columns
    known: frozenset[str]
    order: dict[str, int]
    known_array: pa.Array


@cache
def layout(names: tuple[str, ...] = ALL_TOOL_NAMES) -> Layout:
    """The layout of a run whose tools are `names` (in the order its lines' tool_stats list them)."""
    schema = _schema(names)
    json_schema = pa.schema(
        [
            pa.field("conversations", pa.list_(_JSON_TURN)) if f.name == "conversations" else f
            for f in schema
            if f.name != "extra"
        ]
    )
    order = {name: i for i, name in enumerate(names)}
    return Layout(names, schema, json_schema, frozenset(names), order, pa.array(names, _s))


def _schema(names: tuple[str, ...]) -> pa.Schema:
    return pa.schema(
        [
            ("prompt_index", _i),
            ("sample_index", _i),
            ("conversations", pa.list_(TURN)),
            ("metadata", pa.struct([("batch_num", _i), ("timestamp", _s), ("model", _s)])),
            (
                "task",
                pa.struct(
                    [
                        ("name", _s),
                        ("difficulty", _s),
                        ("category", _s),
                        ("tags", pa.list_(_s)),
                        ("image", _s),
                        ("image_id", _s),
                    ]
                ),
            ),
            ("completed", pa.bool_()),
            ("partial", pa.bool_()),
            ("stop_reason", _s),
            ("api_calls", _i),
            ("toolsets_used", pa.list_(_s)),
            ("tool_stats", pa.struct([(name, _STATS) for name in names])),
            ("tool_error_counts", pa.struct([(name, _i) for name in names])),
            (
                "usage",
                pa.struct(
                    [
                        ("prompt_tokens", _i),
                        ("completion_tokens", _i),
                        ("total_tokens", _i),
                        ("cost", pa.float64()),
                        ("cached_calls", _i),  # null on lines from before the model-call cache
                    ]
                ),
            ),
            ("tools", _s),
            ("reward", pa.float64()),
            ("passed", pa.bool_()),
            ("extra", _s),
        ]
    )


_JSON_TURN = pa.struct([f for f in TURN if f.name != "extra"])
COLUMNS = frozenset(layout().schema.names) - {"extra"}
TURN_KEYS = frozenset(("from", "value", "tool_calls", "tool_call_id", "name"))
TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")
USAGE_KEYS = frozenset((*TOKENS, "cost", "cached_calls"))
_ZERO = {"count": 0, "success": 0, "failure": 0}


def _text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dumps(obj: dict) -> str | None:
    return json.dumps(obj, ensure_ascii=False) if obj else None


def line_extra(record: dict) -> str | None:
    """The line's fields outside the schema's columns (and its usage's beyond tokens and cost) as JSON text."""
    extra = {k: v for k, v in record.items() if k not in COLUMNS and k != "conversations"}
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    other_usage = {k: v for k, v in usage.items() if k not in USAGE_KEYS}
    if other_usage:
        extra["usage"] = other_usage
    return _dumps(extra)


def turn_extras(record: dict) -> list[str | None]:
    """Each turn's fields outside TURN's as JSON text (None for a turn without any)."""
    out: list[str | None] = []
    for t in record.get("conversations") or ():
        if isinstance(t, dict) and t.keys() - TURN_KEYS:
            out.append(_dumps({k: v for k, v in t.items() if k not in TURN_KEYS}))
        else:
            out.append(None)
    return out


def to_row(record: dict, names: tuple[str, ...] = ALL_TOOL_NAMES) -> dict:
    """A trajectory line → one row of the schema, in Python (for row groups Arrow's reader cannot type)."""
    turns = []
    for t, extra in zip(record.get("conversations") or (), turn_extras(record), strict=True):
        calls = t.get("tool_calls")
        turns.append(
            {
                "from": t.get("from"),
                "value": _text(t.get("value")),
                "tool_calls": [
                    {"id": _text(c.get("id")), "name": c.get("name"), "arguments": _text(c.get("arguments"))}
                    for c in calls
                ]
                if calls
                else None,
                "tool_call_id": _text(t.get("tool_call_id")),
                "name": t.get("name"),
                "extra": extra,
            }
        )
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    cost = usage.get("cost", usage.get("cost_usd"))
    stats = record.get("tool_stats") if isinstance(record.get("tool_stats"), dict) else {}
    errors = record.get("tool_error_counts") if isinstance(record.get("tool_error_counts"), dict) else {}
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    reward = record.get("reward")
    passed = record.get("passed")
    task = record.get("task") if isinstance(record.get("task"), dict) else None
    return {
        "prompt_index": _int(record.get("prompt_index")),
        "sample_index": _int(record.get("sample_index")) or 0,
        "conversations": turns,
        "metadata": {
            "batch_num": _int(meta.get("batch_num")),
            "timestamp": _text(meta.get("timestamp")),
            "model": _text(meta.get("model")),
        },
        "task": {
            **{k: _text(task.get(k)) for k in ("name", "difficulty", "category")},
            "tags": [str(t) for t in task.get("tags") or ()],
            **{k: _text(task.get(k)) for k in ("image", "image_id")},
        }
        if task is not None
        else None,
        "completed": bool(record.get("completed")),
        "partial": bool(record.get("partial")),
        "stop_reason": _text(record.get("stop_reason")),
        "api_calls": _int(record.get("api_calls")),
        "toolsets_used": [str(t) for t in record.get("toolsets_used") or ()],
        "tool_stats": {name: stats.get(name) or _ZERO for name in names},
        "tool_error_counts": {name: int(errors.get(name) or 0) for name in names},
        "usage": {
            **{k: int(usage.get(k) or 0) for k in TOKENS},
            "cost": float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
            "cached_calls": _int(usage.get("cached_calls")),
        },
        "tools": _text(record.get("tools")),
        "reward": float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "passed": passed if isinstance(passed, bool) else None,
        "extra": line_extra(record),
    }


def python_rows(records: list[dict], run: Layout) -> pa.Table:
    """Parsed lines → a table of the run's schema, row by row."""
    try:
        return pa.Table.from_pylist([to_row(r, run.names) for r in records], schema=run.schema)
    except UnicodeEncodeError:  # a lone surrogate from the endpoint: Arrow text must be UTF-8, so it becomes "?"
        clean = [json.loads(json.dumps(r, ensure_ascii=False).encode("utf-8", "replace")) for r in records]
        return pa.Table.from_pylist([to_row(r, run.names) for r in clean], schema=run.schema)


def typed_rows(table: pa.Table, extras: list[str | None], turn_extra: list[str | None], run: Layout) -> pa.Table:
    """Rows Arrow's reader typed (run.json_schema) plus the `extra` texts found beside them → a table of the schema."""
    conv = table.column("conversations").combine_chunks()
    turns = conv.flatten()
    if len(turns) != len(turn_extra) or len(conv) != len(extras):
        raise ValueError("the extra fields do not line up with the rows")  # a bug, never a line's fault
    fields = [turns.field(i) for i in range(turns.type.num_fields)] + [pa.array(turn_extra, _s)]
    turns = pa.StructArray.from_arrays(fields, fields=list(TURN))
    offsets = pc.subtract(conv.offsets, conv.offsets[0])
    columns = []
    for f in run.schema:
        if f.name == "conversations":
            columns.append(pa.ListArray.from_arrays(offsets, turns, type=f.type))
        elif f.name == "extra":
            columns.append(pa.array(extras, _s))
        elif f.name in ("completed", "partial"):
            columns.append(table.column(f.name).fill_null(False))
        elif f.name == "sample_index":
            columns.append(table.column(f.name).fill_null(0))
        else:
            columns.append(table.column(f.name))
    return pa.Table.from_arrays(columns, schema=run.schema)
