"""The Parquet export's column path gives what the Python path gives on the parsed lines: unknown tools, filters,
the card's statistics (to the order of equal counts), extra fields; and lines it cannot vouch for go to Python."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_pin_run import newer, older, regular  # noqa: E402

from agentbatch.export import parquet_columns as columns  # noqa: E402
from agentbatch.export.common import ExportContext, Filters, RunSource, parse_line  # noqa: E402
from agentbatch.export.dataset_card import CardStats, card_body  # noqa: E402
from agentbatch.export.parquet_lines import read_block, scan  # noqa: E402
from agentbatch.export.parquet_rows import layout, line_extra, turn_extras  # noqa: E402

RUN = layout()  # the built-in tools' schema
from agentbatch.export.run_export import export  # noqa: E402
from trajectory import unknown_tools  # noqa: E402

FILTERS = [
    Filters(),
    Filters(completed_only=True, min_turns=2),
    Filters(no_partial=True, no_tool_errors=True, toolsets=("web", "file")),
    Filters(passed_only=True),
    Filters(min_turns=3, toolsets=("terminal",), passed_only=True),
]


def _lines(records: list[dict]) -> list[bytes]:
    return [(json.dumps(r, ensure_ascii=False) + "\n").encode() for r in records]


def _state(s: CardStats) -> dict:
    """Every figure of the card, counters as ordered item lists (the card prints equal counts in that order)."""
    return {k: list(v.items()) if hasattr(v, "items") else v for k, v in vars(s).items()}


def _varied() -> list[dict]:
    """Lines the scan vouches for: current and newer ones, some without usage, metadata or verdict."""
    out = [(regular, newer)[i % 2](i) for i in range(120)]
    for i, r in enumerate(out[::7]):
        r.pop("usage" if i % 3 == 0 else "metadata" if i % 3 == 1 else "tool_error_counts", None)
    out[5]["toolsets_used"] = None
    out[6]["conversations"][0]["tool_calls"] = [{"id": "x", "name": "no_such_tool", "arguments": "{}"}]
    out[8]["conversations"][0]["tool_calls"] = [{"id": "y", "arguments": "{}"}]  # a call without a name
    return out


def test_columns_give_what_python_gives_on_the_parsed_lines():
    records = _varied()
    lines = _lines(records)
    block = read_block(lines, [len(line) for line in lines], RUN)
    assert block.row == list(range(len(lines))), "every line typed, in order"
    assert not any(scan(line, RUN).python for line in lines)
    table = block.table
    assert columns.unknown_tools(table, RUN).tolist() == [bool(unknown_tools(r["conversations"])) for r in records]
    for filters in FILTERS:
        assert columns.rejections(table, filters, RUN) == [filters.rejects(r) for r in records], filters
        kept = [i for i, r in enumerate(records) if not filters.rejects(r)]
        expected, got = CardStats(), CardStats()
        for i in kept:
            expected.add(records[i])
        columns.add_stats(got, table.take(kept), columns.assistant_turns(table)[kept], RUN)
        assert _state(got) == _state(expected), filters


def test_equal_counts_keep_the_order_python_counts_them_in():
    """The card lists equal counts in the order they were first seen, within a line in the registry's order."""
    a, b = regular(1), regular(2)  # read_file once; web_search and terminal once each: all tied
    for order in ([a, b], [b, a], [b, b, a], [a, regular(0), b]):
        lines = _lines(order)
        table = read_block(lines, [len(line) for line in lines], RUN).table
        stats, reference = CardStats(), CardStats()
        columns.add_stats(stats, table, columns.assistant_turns(table), RUN)
        for r in order:
            reference.add(r)
        assert list(stats.tool_calls.items()) == list(reference.tool_calls.items())


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r.update(tool_stats={k: r["tool_stats"][k] for k in reversed(r["tool_stats"])}),
        lambda r: r["tool_stats"].update(retired_tool={"count": 1, "success": 1, "failure": 0}),
        lambda r: r["tool_error_counts"].update(retired_tool=1),
        lambda r: r.update(usage={**{k: v for k, v in r["usage"].items() if k != "cost"}, "cost_usd": 0.5}),
    ],
    ids=["tool_stats_reordered", "tool_stats_unknown_key", "tool_errors_unknown_key", "cost_usd"],
)
def test_lines_whose_keys_change_a_figure_are_parsed_in_python(change):
    record = regular(3)
    change(record)
    (line,) = _lines([record])
    assert read_block([line], [len(line)], RUN).row == [0], "Arrow types it"
    assert scan(line, RUN).python


def test_extra_fields_are_found_without_parsing_the_line():
    records = [newer(i) for i in range(6)] + [older(i) for i in range(30) if (i // 3 + i // 10) % 6 == 2]
    records[0]["big"] = 2**70  # read as the whole line's reading reads it (orjson: a float)
    records[1]["usage"]["reasoning_tokens"] = 7
    records[2]["conversations"][0]["weight"] = None
    records[3]["text"] = 'caf\u00e9 \U0001f600 \\ud800 "quoted"'
    for line in _lines(records):
        found, record = scan(line, RUN), parse_line(line)
        assert not found.python
        assert found.extra == line_extra(record) and found.extra is not None
        assert found.turn_extras == turn_extras(record)
    plain = regular(4)
    found = scan(_lines([plain])[0], RUN)
    assert found.extra == line_extra(plain) == json.dumps({"check": plain["check"]})
    assert found.turn_extras == [None] * len(plain["conversations"])


def test_the_fields_a_runner_adds_are_found_as_the_line_holds_them():
    """A line's check and its turns' logprobs (what current runs write beyond the columns) need no second pass."""
    records = [regular(i) for i in range(5)]
    records[1]["check"] = {"status": "passed", "exit_code": 0, "output": "ok ✓ \\ud800", "seconds": 1.5}
    records[2]["check"] = None
    records[2]["duration_seconds"] = 12.5
    del records[3]["check"]
    records[3]["duration_seconds"] = 0.001
    for t in records[4]["conversations"]:
        if t["from"] == "gpt":
            t["logprobs"] = {"content": [{"token": "é", "logprob": -0.5, "top_logprobs": []}]}
    for record, line in zip(records, _lines(records), strict=True):
        found = scan(line, RUN)
        assert not found.python and found.extra == line_extra(record), record.get("check")
        assert found.turn_extras == turn_extras(record)
    assert scan(_lines([records[4]])[0], RUN).turn_extras.count(None) < len(records[4]["conversations"])


def test_lines_arrow_cannot_type_are_found_among_those_it_can():
    good = _lines([regular(i) for i in range(7)])
    bad = [
        b'{"prompt_index": 1}{"prompt_index": 2}\n',  # two objects on one line
        b"[1, 2]\n",
        b'{"prompt_index": 3, "conversations": [{"from": "human", "value": "caf\xe9"}]}\n',  # not UTF-8
        b'{"prompt_index": 4, "conversations": null}\n',
        b'{"prompt_index": 5, "conversations": [null]}\n',
        b'{"prompt_index": 6, "stop_reason": 7, "conversations": []}\n',
    ]
    lines = [good[0], bad[0], good[1], good[2], bad[1], bad[2], good[3], bad[3], bad[4], good[4], bad[5], *good[5:]]
    block = read_block(lines, [len(line) for line in lines], RUN)
    typed = [i for i, r in enumerate(block.row) if r >= 0]
    assert [lines[i] for i in typed] == good
    assert [block.row[i] for i in typed] == list(range(len(good)))
    assert block.table.column("prompt_index").to_pylist() == list(range(7))


def _reference(run_dir: Path, filters: Filters) -> tuple[dict, str]:
    """The export's counts and card body as the Python path computes them from the parsed lines."""
    source = RunSource(run_dir)
    stats = CardStats()
    for record, _raw in source.trajectories():
        why = filters.rejects(record)
        if why:
            source.counts.filtered[why] += 1
        else:
            stats.add(record)
    c = source.counts
    counts = {"lines": c.lines, "bytes": c.bytes, "not_json": c.not_json, "unknown_tool": c.unknown_tool}
    counts.update(trajectories=c.trajectories, filtered=list(c.filtered.items()), written=stats.rows)
    ctx = ExportContext(run_dir.name, run_dir, {}, {}, filters)
    return counts, card_body(ctx, stats, RUN.schema, 1)


def _interleaved() -> list[dict]:
    """Column runs and a few lines parsed in Python, alternating, every figure of the card tied."""
    a, b, c = regular(1), regular(2), regular(0)  # read_file; web_search and terminal; no tool
    b["tool_stats"]["retired_tool"] = {"count": 0, "success": 0, "failure": 0}  # parsed in Python
    a["metadata"]["model"], b["metadata"]["model"], c["metadata"]["model"] = "m1", "m2", "m3"
    a["stop_reason"], b["stop_reason"], c["stop_reason"] = "max_turns", "answered", "length"
    return [a, b] * 12 + [c] * 24


def _mixed() -> list[dict]:
    """So many lines parsed in Python that whole blocks are, with ties in stop reasons and models."""
    records = []
    for i in range(300):
        r = (regular, newer, older)[i % 3](i)
        r["stop_reason"] = ("answered", "max_turns", "length")[i % 3]
        r["metadata"]["model"] = ("m1", "m2")[i % 2]
        records.append(r)
    return records


@pytest.mark.parametrize("records", [_interleaved, _mixed])
def test_a_run_exports_the_counts_and_card_python_computes(tmp_path, records):
    """Blocks mixing column runs and lines parsed in Python: the card and counts are the Python path's."""
    run_dir = tmp_path / "ties"
    run_dir.mkdir()
    with open(run_dir / "batch_0.jsonl", "w") as f:
        f.writelines(line.decode() for line in _lines(records()))
    for filters in FILTERS:
        doc = export(run_dir, "ties", ("parquet",), filters)["parquet"]
        got = dict(doc["source"], filtered=list(doc["filtered"].items()), written=doc["written"])
        counts, body = _reference(run_dir, filters)
        assert got == counts
        assert (run_dir / "export" / "parquet" / "README.md").read_text().endswith(body)
