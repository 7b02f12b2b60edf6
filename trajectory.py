"""Messages → the trajectory line (ShareGPT turns, docs/output.md), tool statistics and reasoning statistics."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable
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
    """The outcome fields of a line whose row has no check (docs/verified-outcomes.md)."""
    return {
        "reward": None,
        "passed": None,
        "check": {
            "status": "none",
            "exit_code": None,
            "output": "",
            "seconds": 0.0,
            "answer_matched": None,
            "rewards": None,
        },
    }


def check_entry(outcome: dict, checked_at: str) -> dict:
    """One item of a line's `checks`: a check's reward, passed and check (as the line's own), and when it ended."""
    check = outcome.get("check")
    return {
        "reward": outcome.get("reward"),
        "passed": outcome.get("passed"),
        # A line of a version before checks has none: the "none" check, in the one shape every line's has.
        "check": dict(check) if isinstance(check, dict) else no_check()["check"],
        "checked_at": checked_at,
    }


def no_task() -> dict:
    """The `task` of a line whose row is not a Harbor task: the same keys, no values (docs/harbor.md)."""
    return {"name": None, "difficulty": None, "category": None, "tags": [], "image": None, "image_id": None}


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


_BUILT_IN = frozenset(ALL_TOOL_NAMES)


def _zero_stats(names: Iterable[str]) -> dict[str, dict[str, int]]:
    return {name: {"count": 0, "success": 0, "failure": 0} for name in names}


def with_tool_names(record: dict, names: tuple[str, ...]) -> dict:
    """The line with an entry in tool_stats and tool_error_counts for each of `names`, in that order (zeros where
    it has none, its own entries beyond them after): a resumed run whose tools changed gives every line the same
    keys. The line itself when it has them already."""
    stats, errors = record.get("tool_stats"), record.get("tool_error_counts")
    if not isinstance(stats, dict) or not isinstance(errors, dict):
        return record
    if tuple(stats) == names and tuple(errors) == names:
        return record
    zero = {"count": 0, "success": 0, "failure": 0}
    return {
        **record,
        "tool_stats": {**{n: stats.get(n, zero) for n in names}, **stats},
        "tool_error_counts": {**{n: errors.get(n, 0) for n in names}, **errors},
    }


def tool_stats_of(messages: list[dict], names: Iterable[str] = ALL_TOOL_NAMES) -> dict[str, dict[str, int]]:
    """Per tool: calls, successes, failures, from the agent loop's tool messages and the `ok` each carries.

    Every tool of `names` (the run's tools: the built-ins and its own) has an entry, called or not.
    """
    stats = _zero_stats(names)
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


def unknown_tools(conversations: list[dict], known: Collection[str] = _BUILT_IN) -> set[str]:
    """Tool names called in these turns that are not among `known` (the run's tools: the built-ins and its own).

    Turns of another shape (not a trajectory's: the run's reader drops such a line before asking) call a tool
    no run has, "?": whatever a line holds, this answers and never raises."""
    try:
        return {name for t in conversations for c in t.get("tool_calls") or [] if (name := c.get("name")) not in known}
    except (AttributeError, TypeError):  # a turn or call that is no object, a name that is a list...
        return {"?"}


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
    identity: str | None = None,
    tool_names: Iterable[str] = ALL_TOOL_NAMES,
    task: dict | None = None,
    duration_seconds: float | None = None,
    token_ids: bool = False,
    tokens: dict | None = None,
    policy_version: str | None = None,
) -> dict:
    """One trajectory line; every line of a run has the same keys and nested shape, so `datasets` loads any mix.

    `outcome` is the line's `reward`, `passed` and `check` (verification.CheckResult.fields()); `identity` is the
    row's (dataset.task_identity), which the runner always gives; `tool_names` are the run's tools, each with
    its entry in `tool_stats` and `tool_error_counts`; `task` is a Harbor task's name, difficulty, category
    and tags; `duration_seconds` how long the sample ran, from its sandbox's check to its own check's end;
    `tokens` the sample's token ids (agentbatch.sample_tokens), on every line of a --token_ids run (`token_ids`);
    `policy_version` the label of the policy its model calls used (--policy_version), absent without one.
    """
    conversations = to_conversations(messages)
    stats = tool_stats_of(messages, tool_names)
    outcome = outcome or no_check()
    return {
        "prompt_index": prompt_index,
        "conversations": conversations,
        "metadata": {"batch_num": batch_num, "timestamp": timestamp, "model": model},
        "task": dict(task) if task else no_task(),
        "completed": completed,
        "partial": partial,
        "stop_reason": stop_reason,
        "sample_index": sample_index,
        **({"identity": identity} if identity is not None else {}),
        **({"policy_version": policy_version} if policy_version is not None else {}),
        **outcome,
        # Every check the sample had, newest last (a rescore adds one: rescore.py); reward, passed and check
        # above are always the newest. The run's own is its first.
        "checks": [check_entry(outcome, timestamp)],
        "final_state": None,  # the file of its kept state in final_state/ (--keep_final_state): the runner sets it
        "api_calls": api_calls,
        "toolsets_used": list(toolsets),
        "tool_stats": stats,
        "tool_error_counts": {name: s["failure"] for name, s in stats.items()},
        "usage": {
            **{k: int(usage.get(k, 0)) for k in ("prompt_tokens", "completion_tokens", "total_tokens")},
            # Always a float, 0.0 when unknown: `datasets` fixes a column's type from the first lines it reads.
            "cost": float(usage.get("cost") or 0.0),
            # The calls the model-call cache answered (--cache): 0 on every line without, so one schema.
            "cached_calls": int(usage.get("cached_calls") or 0),
        },
        **({"duration_seconds": round(float(duration_seconds), 3)} if duration_seconds is not None else {}),
        "tools": _schemas_text(tool_schemas),
        **({"tokens": tokens} if token_ids else {}),
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
# so the merge writes first one line showing each kind the file holds (run_dir/merge.py). Each kind has
# a byte pattern that a line showing it must contain (a key right before its value: JSON escapes quotes inside
# strings, so a key spelled inside a tool result cannot match), to skip parsing most lines.
VALUE_KINDS: dict[str, bytes] = {
    "tool_calls": b'"tool_calls": [',
    "logprobs": b'"logprobs": {',
    "outcome": b'"check": {',
    "reward": b'"reward": ',
    "check_exit_code": b'"exit_code": ',
    "answer_matched": b'"answer_matched": ',
    "identity": b'"identity": "',
    "rewards": b'"rewards": ',
    "task": b'"task": {"name": ',
    "duration": b'"duration_seconds": ',
    "cached_calls": b'"cached_calls": ',
    "checks": b'"checks": [{',
    "final_state": b'"final_state": "',
    "tokens": b'"tokens": {"source": ',
    "token_drift": b'"drift": [',
    "policy_version": b'"policy_version": "',
}


def shown_kinds(record: dict) -> set[str]:
    """The VALUE_KINDS a trajectory line shows a value for."""
    turns = record.get("conversations") or []
    check = record.get("check") if isinstance(record.get("check"), dict) else None
    tokens = record.get("tokens")
    shown = {
        "tool_calls": any(isinstance(t, dict) and t.get("tool_calls") for t in turns),
        "logprobs": any(isinstance(t, dict) and t.get("logprobs") for t in turns),
        "outcome": check is not None,
        "reward": record.get("reward") is not None,
        "check_exit_code": check is not None and check.get("exit_code") is not None,
        "answer_matched": check is not None and check.get("answer_matched") is not None,
        "identity": isinstance(record.get("identity"), str),
        "rewards": check is not None and check.get("rewards") is not None,
        "task": isinstance(record.get("task"), dict) and record["task"].get("name") is not None,
        "duration": isinstance(record.get("duration_seconds"), int | float),
        "cached_calls": isinstance(record.get("usage"), dict) and "cached_calls" in record["usage"],
        "checks": isinstance(record.get("checks"), list) and bool(record["checks"]),
        "final_state": isinstance(record.get("final_state"), str),
        "tokens": isinstance(tokens, dict) and isinstance(tokens.get("source"), str),
        "token_drift": isinstance(tokens, dict) and isinstance(tokens.get("drift"), list) and bool(tokens["drift"]),
        "policy_version": isinstance(record.get("policy_version"), str)
        or isinstance(tokens, dict)
        and isinstance(tokens.get("calls"), list)
        and any(isinstance(c, dict) and c.get("policy_version") is not None for c in tokens["calls"]),
    }
    return {kind for kind, yes in shown.items() if yes}


_CHECK_KINDS = frozenset({"reward", "check_exit_code", "answer_matched", "rewards"})
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
