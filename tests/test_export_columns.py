"""The Parquet export's column path gives what the Python path gives on the parsed lines: unknown tools, filters,
the card's statistics (to the order of equal counts), extra fields; and lines it cannot vouch for go to Python."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyarrow.parquet as pq  # noqa: E402
from export_pin_run import newer, older, regular  # noqa: E402

from agentbatch.export import parquet_columns as columns  # noqa: E402
from agentbatch.export import parquet_shards  # noqa: E402
from agentbatch.export.common import ExportContext, Filters, RunSource, parse_line, parse_value  # noqa: E402
from agentbatch.export.dataset_card import CardStats, card_body  # noqa: E402
from agentbatch.export.parquet_lines import read_block, scan  # noqa: E402
from agentbatch.export.parquet_rows import layout, line_extra, turn_extras  # noqa: E402

RUN = layout()  # the built-in tools' schema
from agentbatch.export.run_export import export  # noqa: E402
from agentbatch.run_dir.files import RunFiles  # noqa: E402
from agentbatch.run_dir.merge import merge  # noqa: E402
from agentbatch.run_dir.record_shape import why_skipped  # noqa: E402
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
    del out[5]["toolsets_used"]  # absent (a null the rule refuses: record_shape)
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
    counts = {"lines": c.lines, "bytes": c.bytes, **c.skipped()}
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


def _set(path: tuple, value):
    """A change to a line: the value at `path` (keys and list positions) set, or removed when value is _GONE."""

    def change(r: dict) -> dict:
        node = r
        for key in path[:-1]:
            node = node[key]
        if value is _GONE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return r

    return change


_GONE = object()
_CALL = ("conversations", 1, "tool_calls", 0)
_STAT = ("tool_stats", "terminal")
# One change each, to a line with tool calls (regular(1): read_file), among lines Arrow types and the scan vouches
# for: the rule (record_shape.why_skipped) refuses most of them, takes a few (marked), and Arrow's columns show
# some of them, the scan sends the rest to Python.
_CHANGES = {
    "conversations empty": _set(("conversations",), []),
    "a turn of another role": _set(("conversations", 0, "from"), "robot"),
    "a turn without a role": _set(("conversations", 0, "from"), None),
    "a turn's value null": _set(("conversations", 1, "value"), None),
    "a turn without a value": _set(("conversations", 1, "value"), _GONE),
    "the first turn not the prompt": _set(("conversations", 0, "from"), "gpt"),
    "a call null": _set(("conversations", 1, "tool_calls"), [None]),
    "a call without a name": _set((*_CALL, "name"), _GONE),
    "a call's name null": _set((*_CALL, "name"), None),
    "a call without arguments": _set((*_CALL, "arguments"), _GONE),
    "a call's id null (taken)": _set((*_CALL, "id"), None),
    "tool_calls null (taken)": _set(("conversations", 0, "tool_calls"), None),
    "a turn's name null (taken)": _set(("conversations", 2, "name"), None),
    "completed null": _set(("completed",), None),
    "partial null": _set(("partial",), None),
    "completed absent (taken)": _set(("completed",), _GONE),
    "prompt_index null": _set(("prompt_index",), None),
    "api_calls null": _set(("api_calls",), None),
    "sample_index null": _set(("sample_index",), None),
    "metadata null": _set(("metadata",), None),
    "metadata absent (taken)": _set(("metadata",), _GONE),
    "toolsets_used null": _set(("toolsets_used",), None),
    "a toolset null": _set(("toolsets_used",), ["terminal", None]),
    "toolsets_used absent (taken)": _set(("toolsets_used",), _GONE),
    "tool_stats null": _set(("tool_stats",), None),
    "a tool's stats null": _set(_STAT, None),
    "a count null": _set((*_STAT, "count"), None),
    "a count absent (taken)": _set((*_STAT, "success"), _GONE),
    "a stat beyond the counts (taken)": _set((*_STAT, "note"), "x"),
    "tool_error_counts null": _set(("tool_error_counts",), None),
    "an error count null": _set(("tool_error_counts", "terminal"), None),
    "usage null": _set(("usage",), None),
    "a token count null": _set(("usage", "total_tokens"), None),
    "a cost that is text (taken)": _set(("usage", "cost"), "0.5"),
    "identity a number": _set(("identity",), 5),
    "identity null (taken)": _set(("identity",), None),
    "discard_reason a number": _set(("discard_reason",), 5),
    "stop_reason a number": _set(("stop_reason",), 5),
    "prompt_index a fraction": _set(("prompt_index",), 1.5),
    "a call of a tool the run lacks": _set((*_CALL, "name"), "no_such_tool"),
}
_RAW = [
    b'{"prompt_index": 1, "conversations": [{"from": "hu\n',  # torn
    b"not json\n",
    b"[1]\n",
    b'"a string"\n',
    b"null\n",
    b'{"a": 1}\n',
    b'{"conversations": "x"}\n',
    b'{"conversations": [{"from": "human", "value": "caf\xe9"}]}\n',  # not UTF-8
]


def _rule_lines() -> list[bytes]:
    """Good lines, one line of each change, the raw ones, and lines whose keys repeat (JSON takes the last)."""
    lines = []
    for n, (name, change) in enumerate(_CHANGES.items()):
        record = change(dict(regular(1), prompt_index=1000 + n, identity=f"id-{n}", note=name))
        lines.append((json.dumps(record) + "\n").encode())
        lines += _lines([regular(n), newer(n)])
    good = json.dumps(regular(3))[1:]
    lines.append(b'{"completed": null, ' + good.encode() + b"\n")  # the last `completed` is true: taken
    lines.append(b'{"prompt_index": 7, "conversations": [], ' + good.encode() + b"\n")  # taken
    lines.append(good.encode()[:-1] + b', "completed": null}\n')  # refused
    lines.append(good.encode()[:-1] + b', "conversations": "x"}\n')  # refused
    for depth in (600, 100_000):  # nested past any sane depth: not JSON, whichever parser reads it
        lines.append(good.encode()[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}\n")
    lines.append(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000  # deeper than orjson's stack: it must never read it
    lines += [deep + b"\n", good.encode()[:-1] + b', "x": ' + deep + b"}\n"]
    return lines + _RAW


def _python_rule(line: bytes) -> str | None:
    return why_skipped("trajectory", parse_value(line), RUN.known)


def test_the_columns_apply_the_rule_python_applies_to_every_kind_of_line():
    lines = _rule_lines()
    expected = [_python_rule(line) for line in lines]
    assert expected.count(None) >= len(lines) // 2 and {"not_json", "malformed", "unknown_tool"} <= set(expected)
    block = read_block(lines, [len(line) for line in lines], RUN)
    bad, unknown = columns.malformed(block.table), columns.unknown_tools(block.table, RUN)
    by_columns = 0
    for i, row in enumerate(block.row):
        if row < 0 or scan(lines[i], RUN).python:
            continue  # the export parses it in Python, where the rule itself applies
        got = "malformed" if bad[row] else "unknown_tool" if unknown[row] else None
        assert got == expected[i], (lines[i][:300], got, expected[i])
        by_columns += got is not None
    assert by_columns >= 12, "the columns decide most wrong lines themselves"


@pytest.mark.parametrize("python_lines", [0, 32, 10**9], ids=["all in Python", "as exported", "all on columns"])
def test_the_parquet_export_keeps_and_counts_the_lines_the_rule_keeps(tmp_path, monkeypatch, python_lines):
    """The whole export over those lines: the rows written are the lines the rule keeps, and the lines left out are
    counted as the merge counts them, whether a block goes to Python or stays on Arrow's columns."""
    monkeypatch.setattr(parquet_shards, "PYTHON_LINES_PER_BLOCK", python_lines)
    run_dir = tmp_path / "rule"
    run_dir.mkdir()
    lines = _rule_lines()
    (run_dir / "batch_0.jsonl").write_bytes(b"".join(lines))
    kept = [parse_value(line) for line in lines if _python_rule(line) is None]
    doc = export(run_dir, "rule", ("parquet",), Filters())["parquet"]
    merged = merge(RunFiles(str(run_dir)))
    assert {k: doc["source"][k] for k in ("not_json", "malformed", "unknown_tool", "trajectories")} == {
        "not_json": merged.not_json,
        "malformed": merged.malformed,
        "unknown_tool": merged.unknown_tool,
        "trajectories": merged.trajectories,
    }
    assert merged.trajectories == len(kept) and merged.malformed >= 30
    rows = pq.read_table(run_dir / "export" / "parquet" / "data").to_pylist()
    assert [r["prompt_index"] for r in rows] == [r.get("prompt_index") for r in kept]
