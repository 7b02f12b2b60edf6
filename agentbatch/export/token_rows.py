"""`tokens`: one Parquet row per sample of a --token_ids run, its `tokens` as the columns trainers read.

`input_ids` and `assistant_masks` are the names TRL's SFTTrainer takes as pre-tokenized (labels = the id where
the mask is 1, else -100); `logprobs` are float64 (exact, as the endpoint sent them; null where the mask is 0
or none was sent); `group` is the row's identity, so the samples of one prompt (GRPO's group) share it. A
line without tokens (a run before --token_ids, a sample that could not be retokenized, or tokens of another
shape: a hand edit) is skipped, counted under `no_tokens`.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from agentbatch.export.common import ExportContext, FormatWriter, outcome, write_card

FILE = "data.parquet"
ROWS_PER_GROUP = 1024  # rows held before a row group is written: memory stays bounded on a large run
SCHEMA = pa.schema(
    [
        ("group", pa.string()),
        ("index", pa.int32()),
        ("sample", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
        ("assistant_masks", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float64())),
        ("reward", pa.float64()),
        ("source", pa.string()),
        ("drift", pa.string()),
        ("policy_versions", pa.list_(pa.string())),
    ]
)


def _whole(value) -> bool:
    return type(value) is int and 0 <= value < 2**31


def _number(value) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value))


def usable(tokens) -> bool:
    """Whether a line's `tokens` has the shape sample_tokens writes (any other, a hand edit, is skipped)."""
    if not isinstance(tokens, dict):
        return False
    ids, mask, logprobs = tokens.get("ids"), tokens.get("mask"), tokens.get("logprobs")
    if not (isinstance(ids, list) and isinstance(mask, list) and isinstance(logprobs, list)):
        return False
    return (
        len(ids) == len(mask) == len(logprobs)
        and all(_whole(i) for i in ids)
        and all(m in (0, 1) and type(m) is int for m in mask)
        and all(_number(v) for v in logprobs)
        and isinstance(tokens.get("source"), str)
    )


def to_row(record: dict) -> dict | None:
    """The row of one trajectory line, None when it has no usable tokens."""
    tokens = record.get("tokens")
    if not usable(tokens):
        return None
    reward = record.get("reward")
    calls = tokens.get("calls") if isinstance(tokens.get("calls"), list) else []
    versions = [c.get("policy_version") if isinstance(c, dict) else None for c in calls]
    index, sample = record.get("prompt_index"), outcome(record)["sample_index"]
    return {
        "group": record.get("identity") if isinstance(record.get("identity"), str) else str(record.get("prompt_index")),
        "index": index if _whole(index) else None,
        "sample": sample if _whole(sample) else None,
        "input_ids": tokens["ids"],
        "assistant_masks": tokens["mask"],
        "logprobs": [float(v) if v is not None else None for v in tokens["logprobs"]],
        "reward": float(reward) if type(reward) in (int, float) and math.isfinite(reward) else None,
        "source": tokens["source"],
        "drift": json.dumps(tokens["drift"]) if tokens.get("drift") else None,
        "policy_versions": [v if isinstance(v, str) else None for v in versions],
    }


class Writer(FormatWriter):
    def __init__(self, out: Path, ctx: ExportContext):
        super().__init__(out, ctx)
        self.rows: list[dict] = []
        self.writer = pq.ParquetWriter(out / FILE, SCHEMA, compression="zstd")
        self.written = 0
        self.skipped: Counter = Counter()

    def add(self, record: dict, raw: bytes = b"") -> None:
        row = to_row(record)
        if row is None:
            self.skipped["no_tokens"] += 1
            return
        self.rows.append(row)
        if len(self.rows) >= ROWS_PER_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=SCHEMA))
            self.written += len(self.rows)
            self.rows = []

    def finish(self) -> dict:
        self._flush()
        self.writer.close()
        body = (
            f"# {self.ctx.run_name}: token ids\n\n{self.written} samples in `{FILE}`, one row each: `group` (the "
            "prompt's identity), `index`, `sample`, `input_ids`, `assistant_masks` (1 on the ids the model sampled), "
            "`logprobs` (float64, null where not sampled), `reward`, `source` (`endpoint` or `retokenized`), "
            "`drift` (JSON text, or null) and `policy_versions` (one per model call). Written by batch-runner's "
            "`--export=tokens`.\n"
        )
        write_card(self.out / "README.md", "", FILE, body)
        return {"written": self.written, "skipped": dict(self.skipped)}
