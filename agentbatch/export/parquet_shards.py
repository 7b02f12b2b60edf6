"""`parquet`: bounded Parquet shards under data/ and a dataset card, as `datasets.load_dataset(DIR)` and the Hub take them.

One fixed schema for every shard (so any mix of old and new lines is one table): the trajectory line's own
fields as columns, `reward` / `passed` / `usage.cost` null where a line has none, and whatever else a line or a
turn carries (a verification object, logprobs, fields added later) as JSON text in an `extra` column.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
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
_COLUMNS = set(SCHEMA.names) - {"extra"}
_TURN_KEYS = ("from", "value", "tool_calls", "tool_call_id", "name")
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


class Writer:
    def __init__(self, out: Path, ctx: ExportContext):
        self.out, self.ctx = out, ctx
        (out / "data").mkdir()
        self.rows: list[dict] = []
        self.pending = 0  # approximate bytes of the buffered rows
        self.shards: list[Path] = []
        self.writer: pq.ParquetWriter | None = None
        self.stats = CardStats()

    def add(self, record: dict) -> None:
        self.stats.add(record)
        row = to_row(record)
        self.rows.append(row)
        self.pending += sum(len(t["value"] or "") for t in row["conversations"]) + len(row["tools"] or "") + 2048
        if self.pending >= BATCH_SOURCE_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=SCHEMA)
        self.rows, self.pending = [], 0
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
        return {"written": self.stats.rows, "shards": n}
