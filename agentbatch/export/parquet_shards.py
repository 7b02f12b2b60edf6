"""`parquet`: bounded Parquet shards under data/ and a dataset card, as `datasets.load_dataset(DIR)` and the Hub take them.

One fixed schema for every shard (so any mix of old and new lines is one table): the trajectory line's own
fields as columns, `reward` / `passed` / `usage.cost` null where a line has none, and whatever else a line or a
turn carries (a verification object, logprobs, fields added later) as JSON text in an `extra` column.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as paj
import pyarrow.parquet as pq

from agentbatch.export.common import ExportContext, write_card
from agentbatch.export.dataset_card import CardStats, card_body
from toolset_distributions import ALL_TOOL_NAMES

SHARD_BYTES = 256 * 1024 * 1024  # the Hub's viewer and most readers are happiest with shards of a few hundred MB
BATCH_SOURCE_BYTES = 4 * 1024 * 1024  # one row group: bounds the memory of an export, whatever the run's size
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
SCHEMA = pa.schema(
    [
        ("prompt_index", _i),
        ("sample_index", _i),
        ("conversations", pa.list_(TURN)),
        ("metadata", pa.struct([("batch_num", _i), ("timestamp", _s), ("model", _s)])),
        ("completed", pa.bool_()),
        ("partial", pa.bool_()),
        ("stop_reason", _s),
        ("api_calls", _i),
        ("toolsets_used", pa.list_(_s)),
        ("tool_stats", pa.struct([(name, _STATS) for name in ALL_TOOL_NAMES])),
        ("tool_error_counts", pa.struct([(name, _i) for name in ALL_TOOL_NAMES])),
        (
            "usage",
            pa.struct([("prompt_tokens", _i), ("completion_tokens", _i), ("total_tokens", _i), ("cost", pa.float64())]),
        ),
        ("tools", _s),
        ("reward", pa.float64()),
        ("passed", pa.bool_()),
        ("extra", _s),
    ]
)
# What Arrow's own JSON reader parses straight from the lines: SCHEMA without the `extra` columns we compute.
_JSON_TURN = pa.struct([f for f in TURN if f.name != "extra"])
JSON_SCHEMA = pa.schema(
    [
        pa.field("conversations", pa.list_(_JSON_TURN)) if f.name == "conversations" else f
        for f in SCHEMA
        if f.name != "extra"
    ]
)
_COLUMNS = set(SCHEMA.names) - {"extra"}
_TURN_KEYS = ("from", "value", "tool_calls", "tool_call_id", "name")
_TURN_KEY_SET = frozenset(_TURN_KEYS)
_TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")
_ZERO = {"count": 0, "success": 0, "failure": 0}


def _text(value) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def to_row(record: dict) -> dict:
    """A trajectory line → one row of SCHEMA."""
    turns = []
    for t in record.get("conversations") or ():
        calls = t.get("tool_calls")
        extra = {k: v for k, v in t.items() if k not in _TURN_KEYS}
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
                "extra": json.dumps(extra, ensure_ascii=False) if extra else None,
            }
        )
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    cost = usage.get("cost", usage.get("cost_usd"))
    extra = {k: v for k, v in record.items() if k not in _COLUMNS and k != "conversations"}
    other_usage = {k: v for k, v in usage.items() if k not in (*_TOKENS, "cost")}
    if other_usage:
        extra["usage"] = other_usage
    stats = record.get("tool_stats") if isinstance(record.get("tool_stats"), dict) else {}
    errors = record.get("tool_error_counts") if isinstance(record.get("tool_error_counts"), dict) else {}
    meta = record.get("metadata") if isinstance(record.get("metadata"), dict) else {}
    reward = record.get("reward")
    passed = record.get("passed")
    return {
        "prompt_index": _int(record.get("prompt_index")),
        "sample_index": _int(record.get("sample_index")) or 0,
        "conversations": turns,
        "metadata": {
            "batch_num": _int(meta.get("batch_num")),
            "timestamp": _text(meta.get("timestamp")),
            "model": _text(meta.get("model")),
        },
        "completed": bool(record.get("completed")),
        "partial": bool(record.get("partial")),
        "stop_reason": _text(record.get("stop_reason")),
        "api_calls": _int(record.get("api_calls")),
        "toolsets_used": [str(t) for t in record.get("toolsets_used") or ()],
        "tool_stats": {name: stats.get(name) or _ZERO for name in ALL_TOOL_NAMES},
        "tool_error_counts": {name: int(errors.get(name) or 0) for name in ALL_TOOL_NAMES},
        "usage": {
            **{k: int(usage.get(k) or 0) for k in _TOKENS},
            "cost": float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        },
        "tools": _text(record.get("tools")),
        "reward": float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None,
        "passed": passed if isinstance(passed, bool) else None,
        "extra": json.dumps(extra, ensure_ascii=False) if extra else None,
    }


def _extras(record: dict) -> tuple[str | None, list[str | None]]:
    """The line's fields outside SCHEMA's columns, and each turn's, as JSON text (None when there are none)."""
    extra = {k: v for k, v in record.items() if k not in _COLUMNS and k != "conversations"}
    usage = record.get("usage") if isinstance(record.get("usage"), dict) else {}
    other_usage = {k: v for k, v in usage.items() if k not in (*_TOKENS, "cost")}
    if other_usage:
        extra["usage"] = other_usage
    turns: list[str | None] = []
    for t in record.get("conversations") or ():
        if isinstance(t, dict) and t.keys() - _TURN_KEY_SET:
            more = {k: v for k, v in t.items() if k not in _TURN_KEY_SET}
            turns.append(json.dumps(more, ensure_ascii=False))
        else:
            turns.append(None)
    return (json.dumps(extra, ensure_ascii=False) if extra else None), turns


class Writer:
    def __init__(self, out: Path, ctx: ExportContext):
        self.out, self.ctx = out, ctx
        (out / "data").mkdir()
        self.records: list[dict] = []
        self.lines: list[bytes] = []
        self.extras: list[str | None] = []
        self.turn_extras: list[str | None] = []
        self.pending = 0  # bytes of the buffered lines
        self.shards: list[Path] = []
        self.writer: pq.ParquetWriter | None = None
        self.stats = CardStats()
        self.slow_batches = 0

    def add(self, record: dict, raw: bytes = b"") -> None:
        self.stats.add(record)
        self.records.append(record)
        self.lines.append(raw if raw.endswith(b"\n") else raw + b"\n")
        extra, turns = _extras(record)
        self.extras.append(extra)
        self.turn_extras.extend(turns)
        self.pending += len(raw)
        if self.pending >= BATCH_SOURCE_BYTES:
            self._flush()

    def _fast_table(self) -> pa.Table:
        """The batch through Arrow's JSON reader (C++, threaded): the bulk of the speed of a large export."""
        data = b"".join(self.lines)
        table = paj.read_json(
            io.BytesIO(data),
            read_options=paj.ReadOptions(block_size=len(data) + 1),  # one block: half the CPU of several (measured)
            parse_options=paj.ParseOptions(explicit_schema=JSON_SCHEMA, unexpected_field_behavior="ignore"),
        )
        conv = table.column("conversations").combine_chunks()
        if len(conv) != len(self.records) or conv.null_count:
            raise ValueError("rows do not line up")
        turns = conv.flatten()
        if len(turns) != len(self.turn_extras) or turns.null_count:
            raise ValueError("turns do not line up")
        fields = [turns.field(i) for i in range(turns.type.num_fields)] + [pa.array(self.turn_extras, _s)]
        turns = pa.StructArray.from_arrays(fields, fields=list(TURN))
        offsets = pc.subtract(conv.offsets, conv.offsets[0])
        columns = []
        for f in SCHEMA:
            if f.name == "conversations":
                columns.append(pa.ListArray.from_arrays(offsets, turns, type=f.type))
            elif f.name == "extra":
                columns.append(pa.array(self.extras, _s))
            elif f.name in ("completed", "partial"):
                columns.append(table.column(f.name).fill_null(False))
            elif f.name == "sample_index":
                columns.append(table.column(f.name).fill_null(0))
            else:
                columns.append(table.column(f.name))
        return pa.Table.from_arrays(columns, schema=SCHEMA)

    def _flush(self) -> None:
        if not self.records:
            return
        try:
            table = self._fast_table()
        except (pa.ArrowException, ValueError):
            # A line Arrow's reader cannot type (a number where text belongs, an old shape): row by row instead.
            self.slow_batches += 1
            try:
                table = pa.Table.from_pylist([to_row(r) for r in self.records], schema=SCHEMA)
            except (
                UnicodeEncodeError
            ):  # a lone surrogate from the endpoint: Arrow text must be UTF-8, so it becomes "?"
                clean = [json.loads(json.dumps(r, ensure_ascii=False).encode("utf-8", "replace")) for r in self.records]
                table = pa.Table.from_pylist([to_row(r) for r in clean], schema=SCHEMA)
        self.records, self.lines, self.extras, self.turn_extras, self.pending = [], [], [], [], 0
        if self.writer is None:
            path = self.out / "data" / f"shard-{len(self.shards):05d}.parquet"
            self.shards.append(path)
            self.writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self.writer.write_table(table)
        if os.path.getsize(self.shards[-1]) >= SHARD_BYTES:
            self.writer.close()
            self.writer = None

    def finish(self) -> dict:
        self._flush()
        if self.writer is not None:
            self.writer.close()
        if not self.shards:  # no trajectory passed the filters: one empty shard still carries the schema
            pq.write_table(SCHEMA.empty_table(), self.out / "data" / "shard-00000.parquet")
            self.shards.append(self.out / "data" / "shard-00000.parquet")
        n = len(self.shards)
        for i, path in enumerate(self.shards):
            path.rename(path.with_name(f"train-{i:05d}-of-{n:05d}.parquet"))
        body = card_body(self.ctx, self.stats, SCHEMA, n)
        write_card(self.out / "README.md", "", "data/train-*", body)
        return {"written": self.stats.rows, "shards": n, "row_by_row_batches": self.slow_batches}
