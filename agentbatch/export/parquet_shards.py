"""`parquet`: bounded Parquet shards under data/ and a dataset card, as `datasets.load_dataset(DIR)` and the Hub take them.

The run's lines are read in blocks: Arrow's JSON reader types each block once, the run's rule for which lines
count (the merge's: record_shape.why_skipped), the filters and the card's statistics are computed on its columns,
and only lines the reader or the key scan cannot vouch for are parsed in Python, where the rule itself applies
(parquet_lines). Kept lines go to row groups of ~4 MB of lines, cut where
the export always cut them; a row group holding a line Arrow cannot type is built row by row (parquet_rows).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from agentbatch.export import parquet_columns as columns
from agentbatch.export.common import (
    ExportContext,
    Filters,
    FormatWriter,
    SourceCounts,
    parse_line,
    parse_value,
    write_card,
)
from agentbatch.export.dataset_card import CardStats, card_body
from agentbatch.export.parquet_lines import Block, read_block, scan
from agentbatch.export.parquet_rows import layout, line_extra, python_rows, turn_extras, typed_rows
from agentbatch.run_dir.record_shape import why_skipped

SHARD_BYTES = 256 * 1024 * 1024  # the Hub's viewer and most readers are happiest with shards of a few hundred MB
BATCH_SOURCE_BYTES = 4 * 1024 * 1024  # one row group: bounds the memory of an export, whatever the run's size
# Past this many lines of a block parsed in Python, the whole block is: its statistics are then added line by
# line in order, instead of alternating between column runs and single lines.
PYTHON_LINES_PER_BLOCK = 32
_STATS_COLUMNS = ["completed", "partial", "stop_reason", "metadata", "tool_stats", "usage", "reward", "passed"]


@dataclass
class _Part:
    """Kept lines of one block that go to the row group being filled."""

    block: Block
    rows: list[int] = field(default_factory=list)  # their rows in block.table (-1: not typed)
    extras: list[str | None] = field(default_factory=list)
    turn_extras: list[str | None] = field(default_factory=list)
    lines: list[bytes] = field(default_factory=list)
    records: list[dict | None] = field(default_factory=list)  # parsed already, or None


class Writer(FormatWriter):
    reads_lines = True
    BLOCK_BYTES = BATCH_SOURCE_BYTES  # lines read per block: with no filter, a block is a row group

    def __init__(self, out: Path, ctx: ExportContext):
        super().__init__(out, ctx)
        self.layout = layout(tuple(ctx.tool_names))  # the run's tools: the built-ins and its own
        (out / "data").mkdir()
        self.stats = CardStats()
        self.parts: list[_Part] = []  # the row group being filled
        self.pending = 0  # bytes of its lines
        self.untyped = False  # it holds a line Arrow's reader cannot type
        self.shards: list[Path] = []
        self.writer: pq.ParquetWriter | None = None
        self.slow_batches = 0
        self.buffer: list[bytes] = []  # lines given one at a time by add(), read as a block
        self.sizes: list[int] = []
        self.buffered = 0

    def add(self, record: dict, raw: bytes = b"") -> None:
        """A line the export already read and kept (when other formats are written beside this one)."""
        raw = raw or json.dumps(record, ensure_ascii=False).encode()
        self.buffer.append(raw if raw.endswith(b"\n") else raw + b"\n")
        self.sizes.append(len(raw))
        self.buffered += len(raw)
        if self.buffered >= BATCH_SOURCE_BYTES:
            self._add_buffer()

    def _add_buffer(self) -> None:
        if self.buffer:
            self._add_block(read_block(self.buffer, self.sizes, self.layout), Filters(), SourceCounts())
            self.buffer, self.sizes, self.buffered = [], [], 0

    def add_lines(self, blocks: Iterator[tuple[list[bytes], list[int]]], filters: Filters, counts: SourceCounts) -> int:
        """The run's lines in blocks (RunSource.line_blocks), counted into `counts` as RunSource.trajectories() and
        the filters would count them, the kept ones added; returns how many were kept.

        The next block is read and typed by Arrow in a thread (which the reader runs without the GIL) while this
        one is checked and written: on two cores most of the reading hides behind the rest.
        """

        def read_next() -> Block | None:
            item = next(blocks, None)
            return None if item is None else read_block(*item, self.layout)

        kept = 0
        with ThreadPoolExecutor(1, thread_name_prefix="parquet-read") as pool:
            ahead = pool.submit(read_next)
            while (block := ahead.result()) is not None:
                ahead = pool.submit(read_next)
                kept += self._add_block(block, filters, counts)
        return kept

    def _add_block(self, block: Block, filters: Filters, counts: SourceCounts) -> int:
        lines, table = block.lines, block.table
        scans = [scan(lines[i], self.layout) if r >= 0 else None for i, r in enumerate(block.row)]
        python = [s is None or s.python for s in scans]
        if sum(python) > PYTHON_LINES_PER_BLOCK:
            python = [True] * len(lines)
        if table is not None:
            bad = columns.malformed(table).tolist()
            unknown = columns.unknown_tools(table, self.layout).tolist()
            why = columns.rejections(table, filters, self.layout)
            turns = columns.assistant_turns(table)
            stats_table = table.select(_STATS_COLUMNS)
        run: list[int] = []  # rows of table whose statistics are added together, in order
        kept = 0
        for i, row in enumerate(block.row):
            record = None
            if python[i]:
                value = parse_value(lines[i])
                skip = why_skipped("trajectory", value, self.layout.known)
                if skip is not None:
                    counts.skip(skip)
                    continue
                record = value
                counts.trajectories += 1
                reason = filters.rejects(record)
            else:
                if bad[row] or unknown[row]:
                    counts.skip("malformed" if bad[row] else "unknown_tool")
                    continue
                counts.trajectories += 1
                reason = why[row]
            if reason:
                counts.filtered[reason] += 1
                continue
            kept += 1
            if record is None:
                run.append(row)
            else:
                if run:
                    self._add_stats(stats_table, turns, run)
                    run = []
                self.stats.add(record)
            self._keep(block, i, row, record, scans[i])
        if run:
            self._add_stats(stats_table, turns, run)
        return kept

    def _add_stats(self, table: pa.Table, turns, rows: list[int]) -> None:
        whole = len(rows) == table.num_rows  # rows are increasing: all of them, in order
        columns.add_stats(
            self.stats, table if whole else table.take(rows), turns if whole else turns[rows], self.layout
        )

    def _keep(self, block: Block, i: int, row: int, record: dict | None, found) -> None:
        if not self.parts or self.parts[-1].block is not block:
            self.parts.append(_Part(block))
        part = self.parts[-1]
        part.rows.append(row)
        part.lines.append(block.lines[i])
        part.records.append(record)
        if row < 0:
            self.untyped = True
        elif record is not None:
            part.extras.append(line_extra(record))
            part.turn_extras.extend(turn_extras(record))
        else:
            part.extras.append(found.extra)
            part.turn_extras.extend(found.turn_extras)
        self.pending += block.sizes[i]
        if self.pending >= BATCH_SOURCE_BYTES:
            self._flush()

    def _table(self) -> pa.Table:
        if not self.untyped:
            try:
                tables = [typed_rows(_rows(p), p.extras, p.turn_extras, self.layout) for p in self.parts]
                return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            except (pa.ArrowException, ValueError):  # e.g. text Arrow cannot hold: row by row, as for untyped lines
                pass
        self.slow_batches += 1
        records = [
            r if r is not None else parse_line(line)
            for p in self.parts
            for r, line in zip(p.records, p.lines, strict=True)
        ]
        return python_rows(records, self.layout)

    def _flush(self) -> None:
        if not self.parts:
            return
        table = self._table()
        self.parts, self.pending, self.untyped = [], 0, False
        if self.writer is None:
            path = self.out / "data" / f"shard-{len(self.shards):05d}.parquet"
            self.shards.append(path)
            self.writer = pq.ParquetWriter(path, self.layout.schema, compression="zstd")
        self.writer.write_table(table)
        if os.path.getsize(self.shards[-1]) >= SHARD_BYTES:
            self.writer.close()
            self.writer = None

    def finish(self) -> dict:
        self._add_buffer()
        self._flush()
        if self.writer is not None:
            self.writer.close()
        if not self.shards:  # no trajectory passed the filters: one empty shard still carries the schema
            pq.write_table(self.layout.schema.empty_table(), self.out / "data" / "shard-00000.parquet")
            self.shards.append(self.out / "data" / "shard-00000.parquet")
        n = len(self.shards)
        for i, path in enumerate(self.shards):
            path.rename(path.with_name(f"train-{i:05d}-of-{n:05d}.parquet"))
        body = card_body(self.ctx, self.stats, self.layout.schema, n)
        write_card(self.out / "README.md", "", "data/train-*", body)
        return {"written": self.stats.rows, "shards": n, "row_by_row_batches": self.slow_batches}


def _rows(part: _Part) -> pa.Table:
    table = part.block.table
    whole = len(part.rows) == table.num_rows  # rows are increasing: all of them, in order
    return table if whole else table.take(part.rows)
