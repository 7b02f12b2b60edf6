"""A run's own tools downstream: tools.json, a resume with other tools, statistics and every export."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from cli_helpers import RunDir, assert_clean_exit, read_jsonl, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from toolset_distributions import ALL_TOOL_NAMES

ORDERS = '''
from agentbatch import tool


@tool
def lookup_order(ctx, order_id: str) -> dict:
    """Look an order up."""
    return {"status": "shipped", "order": order_id}
'''
EXTRA = '''
from agentbatch import tool


@tool
def ping(ctx) -> dict:
    """Answer pong."""
    return {"output": "pong"}
'''
SCRIPT = {
    "first": [
        {"reasoning": "r", "tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A-1"}}]},
        thinking(),
    ],
    "second": [{"reasoning": "r", "tool_calls": [{"name": "ping", "arguments": {}}]}, thinking()],
    "third": [thinking("no tools needed")],
}


def session(tmp_path, server, modules: list[str], dist: dict, rows: list[str], *flags):
    for name in modules:
        (tmp_path / f"{name}.py").write_text({"orders": ORDERS, "extra": EXTRA}[name])
    (tmp_path / "d.json").write_text(json.dumps({"mine": dist}))
    args = [
        f"--dataset_file={write_dataset(tmp_path / 'data.jsonl', rows)}",
        "--batch_size=1",
        "--run_name=own",
        "--sandbox=local",
        f"--tools={','.join(str(tmp_path / f'{m}.py') for m in modules)}",
        f"--distributions_file={tmp_path / 'd.json'}",
        "--distribution=mine",
        *flags,
    ]
    return run_cli(args, tmp_path, server)


def test_a_resume_with_other_tools_says_what_changed_and_every_line_has_the_tools_of_both(tmp_path):
    run_dir = RunDir(tmp_path / "data" / "own")
    with ScriptedServer(script=SCRIPT) as server:
        first = session(tmp_path, server, ["orders"], {"orders": 100}, ["first"])
        assert_clean_exit(first)
        assert "this run was started with other tools" not in first.stderr
        assert run_dir.json("tools.json")["toolsets"]["orders"] == ["lookup_order"]

        again = session(tmp_path, server, ["orders"], {"orders": 100}, ["first"], "--resume")
        assert_clean_exit(again)
        assert "this run was started with other tools" not in again.stderr  # the same tools: nothing to say

        second = session(tmp_path, server, ["extra"], {"extra": 100}, ["first", "second"], "--resume")
        assert_clean_exit(second)
        warning = [line for line in second.stderr.splitlines() if "started with other tools" in line]
        assert warning == [
            "warning: this run was started with other tools: added toolset extra (ping); removed toolset orders. "
            "The samples still to run are offered this session's tools; the run's lines now have entries for "
            "the tools of both (tools.json records them)"
        ]
        both = {"orders": 100, "extra": 100}
        third = session(tmp_path, server, ["orders", "extra"], both, ["first", "second", "third"], "--resume")
        assert_clean_exit(third)
        assert "started with other tools" not in third.stderr  # tools.json holds both now

    names = [*ALL_TOOL_NAMES, "lookup_order", "ping"]
    recorded = run_dir.json("tools.json")
    assert recorded["toolsets"]["orders"] == ["lookup_order"] and recorded["toolsets"]["extra"] == ["ping"]
    lines = {r["conversations"][0]["value"]: r for r in run_dir.trajectories()}
    assert set(lines) == {"first", "second", "third"}
    for line in lines.values():  # the first line was written before `ping` existed: it has its entry now
        assert list(line["tool_stats"]) == names and list(line["tool_error_counts"]) == names
    assert (
        lines["first"]["tool_stats"]["lookup_order"]["count"] == 1
        and lines["first"]["tool_stats"]["ping"]["count"] == 0
    )
    assert (
        lines["second"]["offered"] if False else json.loads(lines["second"]["tools"])[0]["function"]["name"] == "ping"
    )
    stats = run_dir.stats()
    assert list(stats["tools"]) == names and stats["merge"]["filtered_unknown_tool"] == 0
    assert stats["tools"]["lookup_order"]["count"] == 1 and stats["tools"]["ping"]["count"] == 1
    assert list(run_dir.batch_records()[-1]["tool_stats"]) == names  # written after the change: both


@pytest.mark.parametrize("formats", ["openai,hermes,atif", "parquet"])
def test_the_exports_carry_the_runs_own_tools(tmp_path, formats):
    with ScriptedServer(script=SCRIPT) as server:
        done = session(tmp_path, server, ["orders"], {"orders": 100, "web": 100}, ["first"], f"--export={formats}")
        assert_clean_exit(done)
        run_dir = tmp_path / "data" / "own"
        export = run_dir / "export"
        if formats == "parquet":
            (shard,) = (export / "parquet" / "data").glob("*.parquet")
            table = pq.read_table(shard)
            assert table.schema.field("tool_stats").type.names == [*ALL_TOOL_NAMES, "lookup_order"]
            assert table.column("tool_stats").to_pylist()[0]["lookup_order"] == {"count": 1, "success": 1, "failure": 0}
        else:
            (line,) = read_jsonl(export / "openai" / "data.jsonl")
            assert {t["function"]["name"] for t in line["tools"]} == {"lookup_order", "web_extract"}
            (hermes,) = read_jsonl(export / "hermes" / "data.jsonl")
            assert "lookup_order" in json.dumps(hermes)
            (doc,) = (export / "atif" / "trajectories").glob("*.json")
            definitions = json.loads(doc.read_text())["agent"]["tool_definitions"]
            assert "lookup_order" in {d["function"]["name"] for d in definitions}
        kept = run_cli(
            ["--run_name=own", f"--output_dir={tmp_path / 'data'}", "--export=openai", "--export_toolsets=orders"],
            tmp_path,
        )
        assert_clean_exit(kept)
        assert "export openai: 1 written" in kept.stderr
        unknown = run_cli(
            ["--run_name=own", f"--output_dir={tmp_path / 'data'}", "--export=openai", "--export_toolsets=sheets"],
            tmp_path,
        )
        assert_clean_exit(unknown, 2)
        assert unknown.stderr.startswith("error: --export_toolsets: this run has no toolset 'sheets'; its toolsets: ")
        assert "orders" in unknown.stderr and unknown.stderr.count("\n") == 1
