"""What a tool module's tools return or do, in a real run: results capped as a whole whatever their shape, a
BaseException as that call's error, and processes a tool forks gone with its worker."""

from __future__ import annotations

import json
import os
import time

from cli_helpers import RunDir, assert_clean_exit, run_cli, running_as, thinking, write_dataset
from scripted_server import ScriptedServer

from agentbatch.tools.results import cap_output, result_text

LIMIT = 20_000  # --max_output_chars's default

BIG = '''
"""Tools whose results are far over the limit, each in another shape."""

from agentbatch import ToolContext, tool


@tool
def nested(ctx: ToolContext) -> dict:
    """5 MB inside a list, beside a short field."""
    return {"pages": ["<" + "x" * 5_000_000 + ">"], "note": "kept whole"}


@tool
def bare(ctx: ToolContext) -> dict:
    """A bare 50 MB string."""
    return "y" * 50_000_000


@tool
def numbers(ctx: ToolContext) -> dict:
    """A million numbers: long for its many values, not for a long text."""
    return {"values": list(range(1_000_000))}
'''

RAISING = '''
"""Tools that raise what is not an Exception."""

import asyncio

from agentbatch import ToolContext, tool


@tool
def interrupt(ctx: ToolContext) -> dict:
    """Raise KeyboardInterrupt."""
    raise KeyboardInterrupt


@tool
def cancel(ctx: ToolContext) -> dict:
    """Raise asyncio.CancelledError."""
    raise asyncio.CancelledError("the tool's own")


@tool
def cleanup_interrupts(ctx: ToolContext) -> dict:
    """Leave a cleanup that raises KeyboardInterrupt at the sample's end."""

    def boom():
        raise KeyboardInterrupt

    ctx.on_cleanup(boom)
    return {"output": "armed"}
'''

FORKING = '''
"""Tools that fork: a child that stays, and a child that returns from the tool."""

import os
import time

from agentbatch import ToolContext, tool


@tool
def spawn(ctx: ToolContext, pid_file: str) -> dict:
    """Fork a child that writes its pid and sleeps for an hour."""
    pid = os.fork()
    if pid == 0:
        with open(pid_file, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(3600)
        os._exit(0)
    return {"output": "forked"}


@tool
def fork_and_return(ctx: ToolContext) -> dict:
    """Fork, and return in both processes."""
    os.fork()
    return {"output": "returned"}
'''


def calls(*names, **arguments) -> dict:
    return {"reasoning": "calling", "tool_calls": [{"name": n, "arguments": arguments} for n in names]}


def run(tmp_path, server, source: str, rows, *flags, timeout: float = 120):
    module = tmp_path / "mine.py"
    module.write_text(source)
    args = [
        f"--dataset_file={write_dataset(tmp_path / 'data.jsonl', rows)}",
        "--batch_size=5",
        "--run_name=r",
        "--sandbox=local",
        f"--tools={module}",
        "--distribution=minimal",
        *flags,
    ]
    return run_cli(args, tmp_path, server, timeout=timeout)


def tool_results(line: dict) -> list[tuple[str, str]]:
    return [(t["name"], t["value"]) for t in line["conversations"] if t["from"] == "tool"]


def test_every_result_is_capped_as_a_whole_whatever_its_shape(tmp_path):
    script = {"big": [calls("nested", "bare", "numbers"), thinking("too much")]}
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, BIG, ["big"])
        sent = [len(json.dumps(r)) for r in server.requests()]
    assert_clean_exit(proc)
    assert max(sent) < 6 * LIMIT  # the three results and the conversation (was 55 MB)
    (line,) = RunDir(tmp_path / "data" / "r").trajectories()
    results = dict(tool_results(line))
    assert all(len(text) < 2 * LIMIT for text in results.values()), {k: len(v) for k, v in results.items()}
    nested = json.loads(results["nested"])
    (page,) = nested["pages"]
    assert page.startswith("<xxx") and page.endswith("xxx>")
    assert nested["note"] == "kept whole"  # the short field beside it is not cut: the page gets the rest
    assert f"[{5_000_002 - (LIMIT - len('kept whole'))} characters cut]" in page
    bare = json.loads(results["bare"])
    assert bare.startswith("yyy") and "[49980000 characters cut]" in bare
    numbers = json.loads(results["numbers"])  # cut as JSON text: its head and its tail, under "output"
    assert numbers["output"].startswith('{"values": [0, 1, 2, ') and numbers["output"].endswith("999998, 999999]}")
    assert "characters cut" in numbers["output"]
    assert line["tool_stats"]["numbers"] == {"count": 1, "success": 1, "failure": 0}
    batch = next((tmp_path / "data" / "r").glob("batch_*.jsonl"))
    assert batch.stat().st_size < 10 * LIMIT


def test_the_terminal_output_is_cut_as_it_always_was_and_a_failed_result_stays_failed():
    full = "".join(f"{i}\n" for i in range(1, 5001))
    text = result_text({"output": full, "exit_code": 0, "error": None}, 1000, str)
    assert json.loads(text)["output"] == cap_output(full, 1000)  # one long text: the limit is its own
    two = json.loads(result_text({"a": "a" * 5000, "b": "b" * 5000, "c": "short"}, 1000, str))
    assert two["c"] == "short" and len(two["a"]) < 600 and len(two["b"]) < 600
    failed = json.loads(result_text({"error": "bad", "items": list(range(10_000))}, 1000, str, ok=False))
    assert list(failed) == ["error"] and failed["error"].startswith('{"error": "bad", "items": [0, 1')
    secret = "sk-secret-0123456789abcdef"
    redacted = result_text({"deep": [[secret * 3]]}, 1000, lambda t: t.replace(secret, "[REDACTED]"))
    assert secret not in redacted and "[REDACTED]" in redacted


def test_a_tool_raising_keyboard_interrupt_or_cancelled_error_fails_that_call_and_the_run_goes_on(tmp_path):
    script = {
        "raise": [calls("interrupt", "cancel", "cleanup_interrupts"), thinking("went on")],
        "next": [thinking("and the next sample ran")],
    }
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, RAISING, ["raise", "next"], "--num_workers=1", timeout=90)  # it hung forever
    assert_clean_exit(proc)
    lines = {r["conversations"][0]["value"]: r for r in RunDir(tmp_path / "data" / "r").trajectories()}
    assert set(lines) == {"raise", "next"}
    results = [(name, json.loads(value)) for name, value in tool_results(lines["raise"])]
    assert results == [
        ("interrupt", {"error": "KeyboardInterrupt"}),
        ("cancel", {"error": "CancelledError: the tool's own"}),
        ("cleanup_interrupts", {"output": "armed"}),
    ]
    assert lines["raise"]["completed"] and lines["raise"]["tool_stats"]["interrupt"]["failure"] == 1


def _gone(pid: int) -> bool:
    """Whether the process is gone: no such pid, a zombie, or a pid used again by another program."""
    return not running_as(pid, "br-worker")


def test_what_a_tool_forks_never_runs_the_sample_on_and_dies_with_its_worker(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = {"fork": [calls("fork_and_return"), calls("spawn", pid_file=str(pid_file)), thinking("forked twice")]}
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, FORKING, ["fork"], "--num_workers=1")
        requests = server.requests()
    assert_clean_exit(proc)
    # The child that returned from the tool went no further: no model call of its own, no line of its own.
    assert len(requests) == 3
    (line,) = RunDir(tmp_path / "data" / "r").trajectories()
    assert [json.loads(v) for _, v in tool_results(line)] == [{"output": "returned"}, {"output": "forked"}]
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = not _gone(child)
    if alive:
        os.kill(child, 9)
    assert not alive, "the child a tool forked outlived its worker and the run"
