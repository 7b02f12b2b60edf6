"""Messages → the trajectory line (ShareGPT turns, README "Output"), tool statistics and reasoning statistics."""

from __future__ import annotations

import json
from typing import Any

from toolset_distributions import ALL_TOOL_NAMES


def to_conversations(messages: list[dict]) -> list[dict]:
    """OpenAI-format messages (user turn onward) → ShareGPT turns with tool calls and tool results."""
    turns: list[dict] = []
    for m in messages:
        role = m["role"]
        if role == "user":
            turns.append({"from": "human", "value": m["content"]})
        elif role == "assistant":
            turn: dict[str, Any] = {
                "from": "gpt",
                "value": with_think_block(m.get("reasoning") or "", m.get("content") or ""),
            }
            if m.get("logprobs"):
                turn["logprobs"] = m["logprobs"]
            if m.get("tool_calls"):
                turn["tool_calls"] = [
                    {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "arguments": _as_json_string(c["function"]["arguments"]),
                    }
                    for c in m["tool_calls"]
                ]
            turns.append(turn)
        elif role == "tool":
            turns.append({"from": "tool", "value": m["content"], "tool_call_id": m["tool_call_id"], "name": m["name"]})
    return turns


# How a sample ended, one value per way (docs/output.md), and what each means: every trajectory line carries
# one, and a failed attempt's line in failed.jsonl says "error". The one definition: statistics count them in
# this order, the Inspect export translates them, the docs list them.
STOP_REASONS: dict[str, str] = {
    "answered": "a reply without tool calls: completed",
    "max_turns": "--max_turns model calls without an answer",
    "length": "a reply cut by the length limit: partial",
    "context": "the conversation outgrew the context window: partial",
    "invalid_tools": "three replies in a row naming tools the sample lacks: partial",
    "time": "the sample's time limit (--prompt_timeout) came first: partial",
    "tokens": "its token limit (--max_tokens_per_prompt) came first: partial",
    "cost": "its cost limit (--max_cost_per_prompt) came first: partial",
    "error": "the attempt failed (failed.jsonl): no trajectory",
}


def no_check() -> dict:
    """The outcome fields of a line whose row has no check (README, "Verified outcomes")."""
    return {
        "reward": None,
        "passed": None,
        "check": {"status": "none", "exit_code": None, "output": "", "seconds": 0.0, "answer_matched": None},
    }


def with_think_block(reasoning: str, content: str) -> str:
    """The ShareGPT gpt value: reasoning first as a <think> block, then the content."""
    if not reasoning:
        return content
    return f"<think>\n{reasoning}\n</think>\n{content}" if content else f"<think>\n{reasoning}\n</think>"


def has_think_block(value: str) -> bool:
    return value.startswith("<think>\n")


def split_think_block(value: str) -> tuple[str, str]:
    """(reasoning, content) of a gpt value: the inverse of with_think_block."""
    if not has_think_block(value):
        return "", value
    end = value.find("\n</think>\n", 8)
    if end >= 0:
        return value[8:end], value[end + 10 :]
    if value.endswith("\n</think>"):
        return value[8:-9], ""
    return "", value  # an unclosed tag is content, as the model wrote it


def to_openai_messages(conversations: list[dict]) -> list[dict]:
    """ShareGPT turns → OpenAI chat messages: reasoning as `reasoning_content`, tool calls with string arguments.

    Content is always a string ("" beside tool calls), as chat templates concatenate it.
    """
    messages: list[dict] = []
    for turn in conversations:
        kind = turn.get("from")
        if kind == "human":
            messages.append({"role": "user", "content": turn.get("value") or ""})
        elif kind == "system":
            messages.append({"role": "system", "content": turn.get("value") or ""})
        elif kind == "gpt":
            reasoning, content = split_think_block(turn.get("value") or "")
            m: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning:
                m["reasoning_content"] = reasoning
            if turn.get("tool_calls"):
                m["tool_calls"] = [
                    {
                        "id": c.get("id"),
                        "type": "function",
                        "function": {"name": c.get("name"), "arguments": _as_json_string(c.get("arguments"))},
                    }
                    for c in turn["tool_calls"]
                ]
            messages.append(m)
        elif kind == "tool":
            messages.append(
                {"role": "tool", "tool_call_id": turn.get("tool_call_id"), "content": turn.get("value") or ""}
            )
    return messages


def from_openai_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages → ShareGPT turns (the inverse of to_openai_messages); a tool turn's name is its call's."""
    names: dict[Any, str] = {}
    turns: list[dict] = []
    for m in messages:
        if m.get("role") == "system":
            turns.append({"from": "system", "value": m.get("content") or ""})
            continue
        if m.get("role") == "assistant":
            names = {c.get("id"): c["function"]["name"] for c in m.get("tool_calls") or []}
            m = dict(m, reasoning=m.get("reasoning_content") or "")
        elif m.get("role") == "tool":
            m = dict(m, name=m.get("name") or names.get(m.get("tool_call_id")))
        turns.extend(to_conversations([m]))
    return turns


def _zero_stats() -> dict[str, dict[str, int]]:
    return {name: {"count": 0, "success": 0, "failure": 0} for name in ALL_TOOL_NAMES}


def tool_stats_of(messages: list[dict]) -> dict[str, dict[str, int]]:
    """Per tool: calls, successes, failures, from the agent loop's tool messages and the `ok` each carries."""
    stats = _zero_stats()
    for m in messages:
        if m["role"] == "tool":
            entry = stats.setdefault(m["name"], {"count": 0, "success": 0, "failure": 0})
            entry["count"] += 1
            entry["success" if m.get("ok", True) else "failure"] += 1
    return stats


def result_succeeded(value: str) -> bool:
    """A tool result succeeded unless it is a JSON object with a non-empty error."""
    try:
        parsed = json.loads(value)
    except (TypeError, ValueError):
        return True
    return not (isinstance(parsed, dict) and parsed.get("error"))


def reasoning_counts(conversations: list[dict]) -> tuple[int, int]:
    """(gpt turns with reasoning, gpt turns without)."""
    gpt = [t for t in conversations if t.get("from") == "gpt"]
    with_r = sum(1 for t in gpt if has_think_block(t.get("value") or ""))
    return with_r, len(gpt) - with_r


def unknown_tools(conversations: list[dict]) -> set[str]:
    """Tool names called in these turns that are not tools of any toolset."""
    known = set(ALL_TOOL_NAMES)
    return {c.get("name") for t in conversations for c in t.get("tool_calls") or []} - known


def build_record(
    *,
    prompt_index: int,
    messages: list[dict],
    batch_num: int,
    timestamp: str,
    model: str,
    completed: bool,
    partial: bool,
    stop_reason: str,
    api_calls: int,
    toolsets: list[str],
    usage: dict,
    tool_schemas: list[dict],
    sample_index: int = 0,
    outcome: dict | None = None,
) -> dict:
    """One trajectory line; every line has the same keys and nested shape, so `datasets` loads any mix.

    `outcome` is the line's `reward`, `passed` and `check` (verification.CheckResult.fields()).
    """
    conversations = to_conversations(messages)
    stats = tool_stats_of(messages)
    return {
        "prompt_index": prompt_index,
        "conversations": conversations,
        "metadata": {"batch_num": batch_num, "timestamp": timestamp, "model": model},
        "completed": completed,
        "partial": partial,
        "stop_reason": stop_reason,
        "sample_index": sample_index,
        **(outcome or no_check()),
        "api_calls": api_calls,
        "toolsets_used": list(toolsets),
        "tool_stats": stats,
        "tool_error_counts": {name: s["failure"] for name, s in stats.items()},
        "usage": {
            **{k: int(usage.get(k, 0)) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
            # Always a float, 0.0 when unknown: `datasets` fixes a column's type from the first lines it reads.
            "cost": float(usage.get("cost") or 0.0),
        },
        "tools": _schemas_text(tool_schemas),
    }


_SCHEMA_TEXTS: dict[tuple[int, ...], tuple[list[dict], str]] = {}


def _schemas_text(tool_schemas: list[dict]) -> str:
    """The `tools` field: the same few schema lists recur on every line, so each is encoded once per process."""
    key = tuple(map(id, tool_schemas))
    hit = _SCHEMA_TEXTS.get(key)
    if hit is None:
        if len(_SCHEMA_TEXTS) > 512:  # lists of fresh dicts (not the registry's schemas) must not pile up
            _SCHEMA_TEXTS.clear()
        # The list is kept with its text, so the ids in the key stay those of these schemas.
        hit = _SCHEMA_TEXTS[key] = (list(tool_schemas), json.dumps(tool_schemas, ensure_ascii=False))
    return hit[1]


# Values some lines show and others leave absent or null. `datasets` fixes each column's type from the first
# lines it reads, and cannot cast a later number, list or new field into a column it typed as null or missing;
# so the merge writes first one line showing each kind the file holds (run_files.RunFiles.merge). Each kind has
# a byte pattern that a line showing it must contain (a key right before its value: JSON escapes quotes inside
# strings, so a key spelled inside a tool result cannot match), to skip parsing most lines.
VALUE_KINDS: dict[str, bytes] = {
    "tool_calls": b'"tool_calls": [',
    "logprobs": b'"logprobs": {',
    "outcome": b'"check": {',
    "reward": b'"reward": ',
    "check_exit_code": b'"exit_code": ',
    "answer_matched": b'"answer_matched": ',
}


def shown_kinds(record: dict) -> set[str]:
    """The VALUE_KINDS a trajectory line shows a value for."""
    turns = record.get("conversations") or []
    check = record.get("check") if isinstance(record.get("check"), dict) else None
    shown = {
        "tool_calls": any(isinstance(t, dict) and t.get("tool_calls") for t in turns),
        "logprobs": any(isinstance(t, dict) and t.get("logprobs") for t in turns),
        "outcome": check is not None,
        "reward": record.get("reward") is not None,
        "check_exit_code": check is not None and check.get("exit_code") is not None,
        "answer_matched": check is not None and check.get("answer_matched") is not None,
    }
    return {kind for kind, yes in shown.items() if yes}


_CHECK_KINDS = frozenset({"reward", "check_exit_code", "answer_matched"})
_NO_CHECK = b'"check": {"status": "none"'  # how build_record writes a line without a check


def may_show(raw: bytes, kinds: set[str]) -> bool:
    """Whether a raw line may show one of these kinds (False means it surely does not)."""
    if kinds & _CHECK_KINDS and _NO_CHECK in raw:  # one search rules out every check kind
        kinds = kinds - _CHECK_KINDS
    return any(VALUE_KINDS[k] in raw and VALUE_KINDS[k] + b"null" not in raw for k in kinds)


def first_human(record: dict) -> str | None:
    """The prompt text a record answers (its first human turn)."""
    for turn in record.get("conversations") or []:
        if turn.get("from") == "human":
            return turn.get("value")
    return None


def _as_json_string(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
