"""--tools: your own Python tool modules in a real run, and the one-line errors of modules that cannot be used."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from cli_helpers import ROOT, RunDir, assert_clean_exit, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from toolset_distributions import ALL_TOOL_NAMES, DISTRIBUTIONS, prompt_rng, sample_toolsets

ORDERS = '''
"""Tools of an imaginary order system: the toolset `orders` (the module's name)."""

from typing import Annotated, Literal

from agentbatch import ToolContext, tool


@tool
def lookup_order(ctx: ToolContext, order_id: Annotated[str, "The order's id."], detail: Literal["short", "full"] = "short") -> dict:
    """Look an order up."""
    return {"order": order_id, "status": "shipped", "detail": detail}


@tool
def cancel_order(ctx: ToolContext, order_id: str) -> dict:
    """Cancel an order."""
    raise RuntimeError(f"order {order_id} has shipped already")


@tool
def order_note(ctx: ToolContext) -> dict:
    """A note the tool cannot encode."""
    return {"tags": {"a", "b"}}


@tool
def in_sandbox(ctx: ToolContext, text: str) -> dict:
    """Write a file in the sample's sandbox, run a command there, and ask the model about it."""
    box = ctx.sandbox()
    box.write_file("note.txt", text.encode())
    listing = box.exec("cat note.txt && pwd", timeout=ctx.settings.command_timeout)
    answer = ctx.ask([{"role": "user", "content": "summarize: " + text}], model="helper-model")
    return {"output": listing.output, "exit_code": listing.exit_code, "summary": answer}
'''


def module(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


def run(tmp_path, server, *flags, rows=("use the orders",), name="own"):
    dataset = write_dataset(tmp_path / "data.jsonl", list(rows))
    args = [f"--dataset_file={dataset}", "--batch_size=5", f"--run_name={name}", "--sandbox=local", *flags]
    return run_cli(args, tmp_path, server)


def test_a_tool_module_is_a_toolset_the_model_calls(tmp_path):
    orders = module(tmp_path, "orders", ORDERS)
    calls = [
        {"name": "lookup_order", "arguments": {"order_id": "A-1", "detail": "full"}},
        {"name": "cancel_order", "arguments": {"order_id": "A-1"}},
        {"name": "order_note", "arguments": {}},
        {"name": "in_sandbox", "arguments": {"text": "hello box"}},
    ]
    script = {
        "use the orders": [{"reasoning": "look", "tool_calls": calls}, thinking("all done")],
        "just answer": [thinking("nothing to call")],
        "summarize: hello box": [{"content": "a greeting"}],
    }
    with ScriptedServer(script=script) as server:
        dists = tmp_path / "dists.json"
        dists.write_text(json.dumps({"orders_only": {"orders": 100}}))
        proc = run(
            tmp_path,
            server,
            f"--tools={orders}",
            f"--distributions_file={dists}",
            "--distribution=orders_only",
            rows=("use the orders", "just answer"),
        )
        assert_clean_exit(proc)
        helper_calls = [r for r in server.requests() if r.get("model") == "helper-model"]
    run_dir = RunDir(tmp_path / "data" / "own")
    lines = {r["conversations"][0]["value"]: r for r in run_dir.trajectories()}
    assert len(lines) == 2
    line = lines["use the orders"]
    assert line["toolsets_used"] == ["orders"]
    results = {t["name"]: json.loads(t["value"]) for t in line["conversations"] if t["from"] == "tool"}
    assert results["lookup_order"] == {"order": "A-1", "status": "shipped", "detail": "full"}
    assert results["cancel_order"] == {"error": "RuntimeError: order A-1 has shipped already"}
    assert results["order_note"]["error"].startswith("the tool returned something that is not JSON: ")
    sandboxed = results["in_sandbox"]
    assert sandboxed["output"].startswith("hello box") and sandboxed["exit_code"] == 0
    assert sandboxed["summary"] == "a greeting" and len(helper_calls) == 1  # through the run's one client
    offered = [s["function"] for s in json.loads(line["tools"])]
    assert [f["name"] for f in offered] == ["lookup_order", "cancel_order", "order_note", "in_sandbox"]
    assert offered[0]["description"] == "Look an order up."
    assert offered[0]["parameters"]["properties"]["detail"] == {"type": "string", "enum": ["short", "full"]}
    own = ["lookup_order", "cancel_order", "order_note", "in_sandbox"]
    for record in lines.values():  # every line: the built-ins and the run's own, called or not
        assert list(record["tool_stats"]) == [*ALL_TOOL_NAMES, *own]
        assert list(record["tool_error_counts"]) == [*ALL_TOOL_NAMES, *own]
    assert line["tool_stats"]["cancel_order"] == {"count": 1, "success": 0, "failure": 1}
    assert line["tool_error_counts"]["order_note"] == 1 and line["tool_stats"]["lookup_order"]["success"] == 1
    stats = run_dir.stats()
    assert stats["tools"]["lookup_order"] == {"count": 1, "success": 1, "failure": 0, "success_rate": 1.0}
    assert list(stats["tools"]) == [*ALL_TOOL_NAMES, *own]  # every tool of the run, called or not
    assert stats["merge"]["filtered_unknown_tool"] == 0
    assert "lookup_order" in proc.stdout and "cancel_order" in proc.stdout  # the summary's tool table
    recorded = run_dir.json("tools.json")
    assert recorded["toolsets"]["orders"] == own and recorded["sources"] == {"orders": f"--tools {orders}"}


def test_an_importable_module_by_name(tmp_path):
    script = {
        "shout it": [{"reasoning": "r", "tool_calls": [{"name": "shout", "arguments": {"text": "hi"}}]}, thinking()]
    }
    with ScriptedServer(script=script) as server:
        proc = run_cli(
            [
                f"--dataset_file={write_dataset(tmp_path / 'd.jsonl', ['shout it'])}",
                "--batch_size=1",
                "--run_name=named",
                "--sandbox=local",
                "--tools=word_tools",
                "--distribution=word",
                f"--distributions_file={_file(tmp_path, 'd.yaml', 'word: {word_tools: 100}')}",
            ],
            tmp_path,
            server,
            env={"PYTHONPATH": str(ROOT / "tests" / "plugins")},
        )
    assert_clean_exit(proc)
    (line,) = RunDir(tmp_path / "data" / "named").trajectories()
    assert [json.loads(t["value"]) for t in line["conversations"] if t["from"] == "tool"] == [{"output": "HI"}]


def test_own_tools_are_offered_to_every_sample_unless_the_distribution_names_them(tmp_path):
    """--tools with the default distribution (which names only the built-ins) offers the module's tools."""
    word_tools = ROOT / "tests" / "plugins" / "word_tools.py"
    shout = [{"reasoning": "r", "tool_calls": [{"name": "shout", "arguments": {"text": "hi"}}]}, thinking("HI")]
    rows = [f"prompt {i}" for i in range(6)]
    with ScriptedServer(script={**{r: [thinking("quiet")] for r in rows}, "shout it": shout}) as server:
        proc = run(tmp_path, server, f"--tools={word_tools}", rows=("shout it",))
        assert_clean_exit(proc)
        assert "own toolsets, distribution 'default': word_tools offered to every sample" in proc.stderr
        (line,) = RunDir(tmp_path / "data" / "own").trajectories()
        assert line["toolsets_used"] == [*DISTRIBUTIONS["default"].order(), "word_tools"]
        assert [json.loads(t["value"]) for t in line["conversations"] if t["from"] == "tool"] == [{"output": "HI"}]
        # A seeded built-in distribution draws the built-ins as without the module: it comes on top.
        proc = run(
            tmp_path, server, f"--tools={word_tools}", "--distribution=balanced", "--seed=7", rows=rows, name="b"
        )
        assert_clean_exit(proc)
        for line in RunDir(tmp_path / "data" / "b").trajectories():
            i = rows.index(line["conversations"][0]["value"])
            assert line["toolsets_used"] == [
                *sample_toolsets(DISTRIBUTIONS["balanced"], prompt_rng(7, i)),
                "word_tools",
            ]
        # Named by the distribution, its percent holds: at 0%, never offered.
        dists = _file(tmp_path, "d.json", '{"quiet": {"terminal": 100, "word_tools": 0}}')
        proc = run(
            tmp_path,
            server,
            f"--tools={word_tools}",
            f"--distributions_file={dists}",
            "--distribution=quiet",
            name="q",
            rows=rows[:1],
        )
        assert_clean_exit(proc)
        assert "own toolsets, distribution 'quiet': word_tools never (0%)" in proc.stderr
        (line,) = RunDir(tmp_path / "data" / "q").trajectories()
        assert line["toolsets_used"] == ["terminal"] and "shout" not in line["tools"]


def _file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "source, says",
    [
        (
            "from agentbatch import tool\n\n@tool\ndef f(ctx) -> dict:\n    return undefined_name\nx = 1 / 0\n",
            "does not import: ZeroDivisionError: division by zero (bad.py, line 6)",
        ),
        (
            "from agentbatch import tool\n\n@tool\ndef read_file(ctx, path: str) -> dict:\n    return {}\n",
            "clashes with the built-in tool 'read_file'",
        ),
        (
            "from agentbatch import tool\n\n@tool\ndef f(ctx, options: dict) -> dict:\n    return {}\n",
            "parameter 'options' is a dict, which the schema cannot express",
        ),
        ("X = 1\n", "bad.py declares no tool (a function decorated with @tool)"),
    ],
)
def test_a_module_that_cannot_be_used_is_one_line_at_start(tmp_path, source, says):
    bad = _file(tmp_path, "bad.py", source)
    with ScriptedServer(script={}) as server:
        proc = run(tmp_path, server, f"--tools={bad}")
        assert server.requests() == []  # nothing spent
    assert_clean_exit(proc, 2)
    assert proc.stderr.startswith("error: ") and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_missing_module_and_a_distribution_naming_a_toolset_the_run_lacks(tmp_path):
    with ScriptedServer(script={}) as server:
        proc = run(tmp_path, server, "--tools=no_such_module_anywhere")
        assert_clean_exit(proc, 2)
        assert "no_such_module_anywhere" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        fifo = tmp_path / "piped.py"
        os.mkfifo(fifo)  # never opened: reading it would wait for a writer
        proc = run(tmp_path, server, f"--tools={fifo}")
        assert_clean_exit(proc, 2)
        assert proc.stderr.strip() == f"error: plug-in file {fifo} is not a regular file (a directory, device or FIFO)"
        dists = _file(tmp_path, "d.json", '{"mine": {"orders": 50}}')
        proc = run(tmp_path, server, f"--distributions_file={dists}", "--distribution=mine")
        assert_clean_exit(proc, 2)
        assert proc.stderr.strip() == (
            f"error: --distributions_file {dists}: distribution 'mine' names the toolset 'orders', which this run "
            "does not have; its toolsets: web, vision, image_gen, terminal, file, moa, browser"
        )
        proc = run(tmp_path, server, "--distribution=nope")
        assert_clean_exit(proc, 2)
        assert "unknown distribution 'nope'" in proc.stderr
        assert server.requests() == []


def test_list_distributions_shows_the_files_with_the_built_ins(tmp_path):
    orders = module(tmp_path, "orders", ORDERS)
    dists = _file(
        tmp_path,
        "d.json",
        '{"orders_mix": {"description": "Orders and the web.", "toolsets": {"orders": 80, "web": 20}}}',
    )
    proc = run_cli([f"--tools={orders}", f"--distributions_file={dists}", "--list_distributions"], tmp_path)
    assert_clean_exit(proc)
    assert "balanced: Every toolset at even odds." in proc.stdout
    assert f"orders_mix: Orders and the web. (from {dists})\n    orders 80%, web 20%" in proc.stdout
    proc = run_cli([f"--distributions_file={dists}", "--list_distributions"], tmp_path)
    assert_clean_exit(proc, 2)
    assert "names the toolset 'orders', which this run does not have" in proc.stderr
