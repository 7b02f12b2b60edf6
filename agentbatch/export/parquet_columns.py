"""The run's rule for which lines count (record_shape.why_skipped: not trajectories, calling unknown tools), the
export filters and the dataset card's statistics, on Arrow's typed columns.

Each gives what its Python original gives on the parsed lines (record_shape.trajectory_problem,
trajectory.unknown_tools, Filters.rejects, CardStats.add), for lines Arrow typed and whose keys the scan vouched
for (parquet_lines.scan: it sends to Python what of the rule the columns cannot show);
tests/test_export_columns.py holds them to that.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from agentbatch.export.common import Filters
from agentbatch.export.dataset_card import CardStats
from agentbatch.export.parquet_rows import TOKENS, Layout
from agentbatch.run_dir.record_shape import TURN_ROLES

_ROLES = pa.array(TURN_ROLES, pa.string())


def _bools(array) -> np.ndarray:
    """A boolean column as numpy, null as False."""
    return pc.fill_null(array, False).to_numpy(zero_copy_only=False)


def _per_row(values: np.ndarray, parents: np.ndarray, rows: int) -> np.ndarray:
    """How many of the flattened values are true, per row (parents: the row of each value)."""
    return np.bincount(parents[values], minlength=rows) if len(values) else np.zeros(rows, dtype=np.int64)


def assistant_turns(table: pa.Table) -> np.ndarray:
    """Per row: turns from `gpt` (common.assistant_turns)."""
    conv = table.column("conversations").combine_chunks()
    gpt = _bools(pc.equal(conv.flatten().field("from"), "gpt"))
    return _per_row(gpt, pc.list_parent_indices(conv).to_numpy(), len(conv))


def malformed(table: pa.Table) -> np.ndarray:
    """Per row: is it not a trajectory, as far as the columns show it (record_shape.trajectory_problem: turns from
    one of its roles with a value, the first from `human`, tool calls with a name and arguments, toolsets that
    are names). A typed row's conversations and turns are never null (parquet_lines.read_block)."""
    conv = table.column("conversations").combine_chunks()
    rows = len(conv)
    offsets = conv.offsets.to_numpy() - conv.offsets[0].as_py()
    lengths = np.diff(offsets)
    bad = lengths == 0
    turns = conv.flatten()
    if len(turns):
        turn_bad = ~_bools(pc.is_in(turns.field("from"), value_set=_ROLES))
        turn_bad |= turns.field("value").is_null().to_numpy(zero_copy_only=False)
        calls = turns.field("tool_calls")
        flat = calls.flatten()
        if len(flat):
            call_bad = flat.is_null().to_numpy(zero_copy_only=False)
            for name in ("name", "arguments"):
                call_bad |= pc.struct_field(flat, name).is_null().to_numpy(zero_copy_only=False)
            turn_bad |= _per_row(call_bad, pc.list_parent_indices(calls).to_numpy(), len(turns)) > 0
        bad |= _per_row(turn_bad, pc.list_parent_indices(conv).to_numpy(), rows) > 0
        some = np.flatnonzero(~bad & (lengths > 0))
        first = pc.take(turns.field("from"), pa.array(offsets[:-1][some]))
        bad[some] |= ~_bools(pc.equal(first, "human"))
    used = table.column("toolsets_used").combine_chunks()
    names = used.flatten()
    if names.null_count:
        null_names = names.is_null().to_numpy(zero_copy_only=False)
        bad |= _per_row(null_names, pc.list_parent_indices(used).to_numpy(), rows) > 0
    return bad


def unknown_tools(table: pa.Table, run: Layout) -> np.ndarray:
    """Per row: does it call a tool the run does not have (trajectory.unknown_tools; a call without a name counts)."""
    conv = table.column("conversations").combine_chunks()
    calls = conv.flatten().field("tool_calls")
    names = pc.list_flatten(calls)
    rows = len(conv)
    if not len(names):
        return np.zeros(rows, dtype=bool)
    unknown = ~_bools(pc.is_in(pc.struct_field(names, "name"), value_set=run.known_array))
    turn_of_call = pc.list_parent_indices(calls).to_numpy()
    row_of_turn = pc.list_parent_indices(conv).to_numpy()
    return _per_row(unknown, row_of_turn[turn_of_call], rows) > 0


def rejections(table: pa.Table, filters: Filters, run: Layout) -> list[str | None]:
    """Per row: the name of the first filter that drops it, or None (Filters.rejects)."""
    rows = table.num_rows
    why: list[str | None] = [None] * rows
    if not rows:
        return why
    steps: list[tuple[str, np.ndarray]] = []
    if filters.completed_only:
        steps.append(("not_completed", ~_bools(table.column("completed"))))
    if filters.no_partial:
        steps.append(("partial", _bools(table.column("partial"))))
    if filters.no_tool_errors:
        counts = table.column("tool_error_counts").combine_chunks()
        total = np.zeros(rows, dtype=np.int64)
        for name in run.names:
            total += pc.fill_null(pc.struct_field(counts, name), 0).to_numpy(zero_copy_only=False)
        steps.append(("tool_errors", total != 0))
    if filters.min_turns:
        steps.append(("too_few_turns", assistant_turns(table) < filters.min_turns))
    if filters.toolsets:
        used = table.column("toolsets_used").combine_chunks()
        parents = pc.list_parent_indices(used).to_numpy()
        has_all = np.ones(rows, dtype=bool)
        for toolset in set(filters.toolsets):
            has_all &= _per_row(_bools(pc.equal(used.flatten(), toolset)), parents, rows) > 0
        steps.append(("toolsets", ~has_all))
    if filters.passed_only:
        passed = table.column("passed")
        steps.append(("not_passed", _bools(pc.equal(passed, False))))
        steps.append(("no_verdict", _bools(pc.is_null(passed))))
    for name, dropped in reversed(steps):  # the first filter that drops a row names it
        for i in np.flatnonzero(dropped).tolist():
            why[i] = name
    return why


def add_stats(stats: CardStats, table: pa.Table, turns: np.ndarray, run: Layout) -> None:
    """Add these rows (and their assistant_turns) to the card's figures, as CardStats.add would one by one."""
    rows = table.num_rows
    if not rows:
        return
    stats.rows += rows
    stats.completed += int(_bools(table.column("completed")).sum())
    stats.partial += int(_bools(table.column("partial")).sum())
    for reason in table.column("stop_reason").to_pylist():
        stats.stop_reasons[str(reason)] += 1
    for model in pc.struct_field(table.column("metadata"), "model").to_pylist():
        stats.models[str(model)] += 1
    # A tool enters the counter at the first row that called it, in the run's order within a row.
    tool_stats = table.column("tool_stats").combine_chunks()
    first: list[tuple[int, int, str, int]] = []
    for order, name in enumerate(run.names):
        count = pc.fill_null(pc.struct_field(tool_stats, [order, 0]), 0).to_numpy(zero_copy_only=False)
        called = np.flatnonzero(count)
        if len(called):
            first.append((int(called[0]), order, name, int(count.sum())))
    for _row, _order, name, total in sorted(first):
        stats.tool_calls[name] += total
    usage = table.column("usage").combine_chunks()
    for k in TOKENS:
        stats.tokens[k] += int(pc.sum(pc.fill_null(pc.struct_field(usage, k), 0)).as_py() or 0)
    for cost in pc.struct_field(usage, "cost").to_pylist():
        if cost is not None:
            stats.cost += cost
            stats.with_cost += 1
    stats.turns.update(turns.tolist())
    for reward in table.column("reward").to_pylist():
        if reward is not None:
            stats.add_reward(reward)
    passed = table.column("passed")
    verdicts = []
    for key, value in (("passed", True), ("failed", False)):
        seen = np.flatnonzero(_bools(pc.equal(passed, value)))
        if len(seen):  # a key in the counter means a verdict was seen (the card prints its checks line then)
            verdicts.append((int(seen[0]), key, len(seen)))
    for _row, key, n in sorted(verdicts):
        stats.passed[key] += n
