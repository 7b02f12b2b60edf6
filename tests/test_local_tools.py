"""Terminal and file tools in the real local sandbox, driven through the real loop where the model matters."""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers import make_ctx, run_agent_once, tool_turns
from sandbox_support import new_marker, wait_gone
from scripted_server import ScriptedServer

from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.sandboxes.local import LocalSandbox
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings

P = "the prompt"


def terminal_call(command: str) -> dict:
    return {"name": "terminal", "arguments": {"command": command}}


def test_long_tool_output_is_capped_keeping_head_and_tail():
    settings = ToolSettings(max_output_chars=1000)
    script = [{"tool_calls": [terminal_call("seq 1 5000")]}, {"content": "done"}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal"], tool_settings=settings)
        sent = [m for m in srv.requests()[1]["messages"] if m["role"] == "tool"][0]["content"]
    (turn,) = tool_turns(record)
    assert turn["value"] == sent  # the model saw exactly what was saved
    result = json.loads(turn["value"])  # capping inside the value keeps the result valid JSON
    output = result["output"]
    full = "".join(f"{i}\n" for i in range(1, 5001))
    assert len(output) < 1100
    assert output.startswith("1\n2\n3\n") and output.endswith("4999\n5000\n")
    assert f"[{len(full) - 1000} characters cut]" in output
    head, tail = output.split("characters cut]")
    assert len(head) > len(tail) > 100
    assert result["exit_code"] == 0 and result["error"] is None


def test_command_outliving_timeout_is_killed_with_its_children(tmp_path):
    settings = ToolSettings(command_timeout=1.0)
    marker = new_marker()
    # One child stays in the process group; the other leaves it with setsid and would hold the pipe open.
    command = f"sleep {marker}1 & setsid sh -c 'exec sleep {marker}2' & sleep {marker}3"
    script = [{"tool_calls": [terminal_call(command)]}, {"content": "it hung"}]
    with ScriptedServer(script={P: script}) as srv:
        start = time.monotonic()
        record = run_agent_once(srv, P, ["terminal"], tool_settings=settings, cwd=str(tmp_path))
        elapsed = time.monotonic() - start
    assert elapsed < 8
    result = json.loads(tool_turns(record)[0]["value"])
    assert "timed out" in result["error"] and result["exit_code"] == -9
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 0, "failure": 1}
    assert record["completed"] is True  # the loop went on after the failed command
    assert wait_gone(marker, 2.0) == []


def test_background_processes_die_with_the_sandbox(tmp_path):
    marker = new_marker()
    script = [
        {"tool_calls": [terminal_call(f"nohup setsid sleep {marker} > /dev/null 2>&1 & echo started")]},
        {"content": "started a server"},
    ]
    with ScriptedServer(script={P: script}) as srv:
        start = time.monotonic()
        record = run_agent_once(srv, P, ["terminal"], cwd=str(tmp_path))
    assert time.monotonic() - start < 5
    assert json.loads(tool_turns(record)[0]["value"]) == {"output": "started\n", "exit_code": 0, "error": None}
    assert wait_gone(marker, 1.0) == []


def test_api_key_never_reaches_tool_output_or_record(monkeypatch):
    marker = "sk-or-UNIQUE-MARKER-93f1c2"
    monkeypatch.setenv("OPENROUTER_API_KEY", marker)
    monkeypatch.setenv("OPENAI_API_KEY", marker)
    commands = ["env", "cat /proc/self/environ | tr '\\0' '\\n'", "set", "echo $OPENROUTER_API_KEY$OPENAI_API_KEY"]
    script = [{"tool_calls": [terminal_call(c) for c in commands]}, {"content": "looked around"}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"], api_key=marker)
    outputs = [json.loads(t["value"])["output"] for t in tool_turns(record)]
    assert len(outputs) == 4
    assert "PATH=" in outputs[0] and "PATH=" in outputs[1]  # the commands really printed an environment
    assert all(marker not in o for o in outputs)
    assert marker not in json.dumps(record)


@pytest.fixture
def ctx(tmp_path):
    """A tool context whose sandbox works in tmp_path."""
    load_tools()
    c = make_ctx(ToolSettings(command_timeout=10.0), SandboxSpec(cwd=str(tmp_path)))
    yield c
    c.close()


def run(ctx: ToolContext, name: str, **args) -> tuple[dict, bool]:
    out, ok = call_tool(load_tools()[name], json.dumps(args), ctx)
    return json.loads(out), ok


def test_write_read_patch_and_search_files(ctx, tmp_path):
    result, ok = run(ctx, "write_file", path="pkg/mod.py", content="a = 1\nb = 2\nc = 3\n")
    assert ok and result["bytes_written"] == 18
    assert (tmp_path / "pkg" / "mod.py").read_text() == "a = 1\nb = 2\nc = 3\n"
    result, ok = run(ctx, "read_file", path="pkg/mod.py", offset=2, limit=1)
    assert ok and result["content"] == "b = 2\n" and result["total_lines"] == 3
    result, ok = run(ctx, "patch", path="pkg/mod.py", old_string="b = 2", new_string="b = 20")
    assert ok and (tmp_path / "pkg" / "mod.py").read_text() == "a = 1\nb = 20\nc = 3\n"
    (tmp_path / "notes.txt").write_text("b = 20 here too\n")
    result, ok = run(ctx, "search_files", pattern=r"b = [0-9]+", file_glob="*.py")
    assert ok and result["matches"] == ["./pkg/mod.py:2:b = 20"]
    result, ok = run(ctx, "search_files", pattern="b = 20")
    assert ok and result["count"] == 2


def test_file_tool_mistakes_are_failures_the_model_can_read(ctx, tmp_path):
    (tmp_path / "twice.txt").write_text("x x\n")
    result, ok = run(ctx, "patch", path="twice.txt", old_string="x", new_string="y")
    assert not ok and "occurs 2 times" in result["error"]
    result, ok = run(ctx, "patch", path="twice.txt", old_string="zzz", new_string="y")
    assert not ok and "not found" in result["error"]
    result, ok = run(ctx, "read_file", path="nope.txt")
    assert not ok and "FileNotFoundError" in result["error"]
    result, ok = run(ctx, "write_file", path="", content="x")
    assert not ok and "path must be a non-empty string" in result["error"]
    result, ok = run(ctx, "write_file", path="a.txt")
    assert not ok and result["error"] == "invalid arguments: content is required"
    assert (tmp_path / "twice.txt").read_text() == "x x\n"


def test_terminal_runs_in_the_working_directory_with_a_clean_environment(ctx, tmp_path):
    result, ok = run(ctx, "terminal", command="pwd; echo $HOME; exit 3")
    lines = result["output"].splitlines()
    assert ok and result["exit_code"] == 3 and result["error"] is None  # a failing command is still a result
    assert lines[0] == str(tmp_path)
    assert lines[1] != os.environ.get("HOME") and os.path.isdir(lines[1]) is True


def test_fresh_local_sandboxes_are_separate_and_removed():
    a, b = LocalSandbox(), LocalSandbox()
    try:
        assert a.workdir != b.workdir
        a.write_file("f.txt", b"from a")
        assert b.exec("cat f.txt", timeout=5).exit_code != 0
        assert a.read_file(os.path.join(a.workdir, "f.txt")) == b"from a"
    finally:
        a.cleanup()
        b.cleanup()
    assert not os.path.exists(a.workdir) and not os.path.exists(b.workdir)


def test_context_close_after_loop_removes_the_sandbox():
    script = [{"tool_calls": [terminal_call("pwd")]}, {"content": "done"}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal"])
    workdir = json.loads(tool_turns(record)[0]["value"])["output"].strip()
    assert workdir.startswith("/") and not os.path.exists(workdir)


def test_file_tools_never_write_outside_the_sandbox(ctx, tmp_path):
    outside = tmp_path.parent / f"outside-{os.getpid()}.txt"
    for path in (str(outside), "../" + outside.name):
        result, ok = run(ctx, "write_file", path=path, content="x")
        assert not ok and "read and write only inside" in result["error"]
    assert not outside.exists()
    os.symlink(tmp_path.parent, tmp_path / "escape")
    result, ok = run(ctx, "write_file", path=f"escape/{outside.name}", content="x")
    assert not ok and not outside.exists()


def test_a_silly_timeout_from_the_model_falls_back_to_the_limit(ctx):
    for silly in (-1, 0, "0.5"):
        result, ok = run(ctx, "terminal", command="echo ran", timeout=silly)
        assert ok and result["output"] == "ran\n"
    # Not a number at all: the declaration's check says so, and nothing runs.
    result, ok = run(ctx, "terminal", command="echo ran", timeout="soon")
    assert not ok and result["error"] == 'invalid arguments: timeout must be a number, got "soon"'
