"""Which lines of a run count, and as what: the one rule every reader of a run applies (run_dir/reader.py, the
merge, the session's appends, the resume scan, the statistics, the budget, the exports, the report).

A line can be valid JSON and still not be a trajectory: `[1]`, `{"a": 1}`, `{"conversations": "x"}`,
`"tool_stats": "bad"`, written by hand, by another tool, or by a bug. Such a line is dropped and counted
(docs/output.md), never trusted: one would crash the statistics, and one in trajectories.jsonl would
break its schema for `datasets`. Only the fields the runner writes are checked, and only their types, so
lines of older versions (without the newer fields) and fields added later by others still pass. A trajectory
that calls a tool the run does not have (tools.json: the built-ins and its own) is dropped and counted too.
The Parquet export applies the same rule to Arrow's columns (export/parquet_columns.py, tested equal).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from agentbatch.run_dir.lines import NOT_JSON
from trajectory import unknown_tools

# What a line is: a trajectory of a batch file, a discarded sample, or a failed attempt.
KINDS = ("trajectory", "discarded", "failed")
TURN_ROLES = ("human", "gpt", "tool", "system")
_COUNTS = ("count", "success", "failure")
_TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")


def why_skipped(kind: str, value: Any, known: Collection[str]) -> str | None:
    """Why a parsed line of a file of this kind does not count (a ReadCounts field: "not_json", "malformed",
    "unknown_tool"), or None when it does. `value` is lines.json_value's; `known`: the run's tools.

    A trajectory or a discard is a trajectory-shaped line (a discard's tools are not checked: it was never kept);
    a failed attempt is any JSON object (its usage was paid for; one without a prompt is still shown).
    """
    if value is NOT_JSON:
        return "not_json"
    if kind == "failed":
        return None if type(value) is dict else "malformed"
    if trajectory_problem(value) is not None:
        return "malformed"
    if kind == "trajectory" and unknown_tools(value["conversations"], known):
        return "unknown_tool"
    return None


def trajectory_problem(record: Any) -> str | None:
    """Why a parsed batch or discarded.jsonl line is not a trajectory line, or None when it is one.

    Plain loops and exact type tests: the merge runs this on every line of every batch file.
    """
    if type(record) is not dict:
        return "not a JSON object"
    turns = record.get("conversations")
    if type(turns) is not list or not turns:
        return "conversations is not a list of turns"
    for turn in turns:
        problem = _turn_problem(turn)
        if problem:
            return problem
    if turns[0]["from"] != "human":
        return "the first turn is not the human prompt"
    for key in ("completed", "partial"):
        if key in record and type(record[key]) is not bool:
            return f"{key} is not true or false"
    for key in ("prompt_index", "api_calls", "sample_index"):
        if key in record and type(record[key]) is not int:
            return f"{key} is not a whole number"
    for key in ("stop_reason", "tools", "discard_reason", "identity"):
        value = record.get(key)
        if value is not None and type(value) is not str:
            return f"{key} is not a string"
    if "metadata" in record and type(record["metadata"]) is not dict:
        return "metadata is not an object"
    used = record.get("toolsets_used", ())
    if type(used) is not list and used != ():
        return "toolsets_used is not a list of names"
    for name in used:
        if type(name) is not str:
            return "toolsets_used is not a list of names"
    return _counts_problem(record)


def _turn_problem(turn: Any) -> str | None:
    if type(turn) is not dict or turn.get("from") not in TURN_ROLES or type(turn.get("value")) is not str:
        return "a turn is not {from, value}"
    calls = turn.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            return "tool_calls is not a list"
        for call in calls:
            if type(call) is not dict or type(call.get("name")) is not str or type(call.get("arguments")) is not str:
                return "a tool call is not {id, name, arguments} strings"
            call_id = call.get("id")
            if call_id is not None and type(call_id) is not str:  # lines of older versions may hold a null id
                return "a tool call id is not a string"
    for key in ("tool_call_id", "name"):
        value = turn.get(key)
        if value is not None and type(value) is not str:
            return f"a turn's {key} is not a string"
    return None


def _counts_problem(record: dict) -> str | None:
    stats = record.get("tool_stats", {})
    if type(stats) is not dict:
        return "tool_stats is not an object"
    for s in stats.values():
        if type(s) is not dict:
            return "tool_stats holds something other than counts"
        for key in _COUNTS:
            if type(s.get(key, 0)) is not int:
                return "tool_stats holds something other than counts"
    errors = record.get("tool_error_counts", {})
    if type(errors) is not dict:
        return "tool_error_counts is not an object of counts"
    for value in errors.values():
        if type(value) is not int:
            return "tool_error_counts is not an object of counts"
    usage = record.get("usage", {})
    if type(usage) is not dict:
        return "usage is not an object"
    for key in _TOKENS:
        if type(usage.get(key, 0)) is not int:
            return "usage token counts are not whole numbers"
    return None
