"""Whether a line read back from a run's files has the shape the resume scan, the merge and the statistics rely on.

A line can be valid JSON and still not be a trajectory: `[1]`, `{"a": 1}`, `{"conversations": "x"}`,
`"tool_stats": "bad"`, written by hand, by another tool, or by a bug. Such a line is dropped and counted
(README, "Output"), never trusted: one would crash the statistics, and one in trajectories.jsonl would
break its schema for `datasets`. Only the fields the runner writes are checked, and only their types, so
lines of older versions (without the newer fields) and fields added later by others still pass.
"""

from __future__ import annotations

from typing import Any

TURN_ROLES = ("human", "gpt", "tool", "system")
_COUNTS = ("count", "success", "failure")
_TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def trajectory_problem(record: Any) -> str | None:
    """Why a parsed batch or discarded.jsonl line is not a trajectory line, or None when it is one."""
    if not isinstance(record, dict):
        return "not a JSON object"
    turns = record.get("conversations")
    if not isinstance(turns, list) or not turns:
        return "conversations is not a list of turns"
    for turn in turns:
        problem = _turn_problem(turn)
        if problem:
            return problem
    if turns[0]["from"] != "human":
        return "the first turn is not the human prompt"
    for key in ("completed", "partial"):
        if key in record and not isinstance(record[key], bool):
            return f"{key} is not true or false"
    for key in ("prompt_index", "api_calls", "sample_index"):
        if key in record and not _whole(record[key]):
            return f"{key} is not a whole number"
    for key in ("stop_reason", "tools", "discard_reason"):
        if record.get(key) is not None and not isinstance(record[key], str):
            return f"{key} is not a string"
    if "metadata" in record and not isinstance(record["metadata"], dict):
        return "metadata is not an object"
    used = record.get("toolsets_used", [])
    if not isinstance(used, list) or not all(isinstance(t, str) for t in used):
        return "toolsets_used is not a list of names"
    return _counts_problem(record)


def _turn_problem(turn: Any) -> str | None:
    if not isinstance(turn, dict) or turn.get("from") not in TURN_ROLES or not isinstance(turn.get("value"), str):
        return "a turn is not {from, value}"
    calls = turn.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            return "tool_calls is not a list"
        for call in calls:
            if not isinstance(call, dict) or not all(isinstance(call.get(k), str) for k in ("name", "arguments")):
                return "a tool call is not {id, name, arguments} strings"
            if not isinstance(call.get("id"), str | None):  # lines of older versions may hold a null id
                return "a tool call id is not a string"
    for key in ("tool_call_id", "name"):
        if not isinstance(turn.get(key), str | None):
            return f"a turn's {key} is not a string"
    return None


def _counts_problem(record: dict) -> str | None:
    stats = record.get("tool_stats", {})
    if not isinstance(stats, dict):
        return "tool_stats is not an object"
    for s in stats.values():
        if not isinstance(s, dict) or not all(_whole(s.get(k, 0)) for k in _COUNTS):
            return "tool_stats holds something other than counts"
    errors = record.get("tool_error_counts", {})
    if not isinstance(errors, dict) or not all(_whole(v) for v in errors.values()):
        return "tool_error_counts is not an object of counts"
    usage = record.get("usage", {})
    if not isinstance(usage, dict) or not all(_whole(usage.get(k, 0)) for k in _TOKENS):
        return "usage token counts are not whole numbers"
    return None
