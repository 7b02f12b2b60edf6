"""The agent loop: ask the model, run the tools it calls, repeat until it answers or a limit stops it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentbatch.limits import TIME_LIMIT_MESSAGE
from agentbatch.model.base import ContextOverflow, DeadlineReached, Model
from agentbatch.model.logprobs import token_logprobs
from agentbatch.model.reasoning import split_reasoning
from agentbatch.sample_tokens import TokenRecorder
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import Tool, call_tool

UNKNOWN_TOOL_LIMIT = 3


@dataclass
class AgentResult:
    """What the loop did: the saved messages (user turn onward), how it ended, and how many calls it made.

    stop_reason is one of trajectory.STOP_REASONS: answered, max_turns, length (the reply was cut),
    context (the conversation outgrew the context window), invalid_tools (tools it lacks, three times),
    time, tokens or cost (a limit of ctx.limits came before the answer).
    """

    messages: list[dict]
    completed: bool = False
    partial: bool = False
    stop_reason: str = ""
    api_calls: int = 0
    tool_schemas: list[dict] = field(default_factory=list)


def run_agent(
    prompt: str,
    client: Model,
    tools: list[Tool],
    ctx: ToolContext,
    max_turns: int,
    system_prompt: str | None = None,
    prefill: list[dict] | None = None,
    logprobs: bool = False,
    recorder: TokenRecorder | None = None,
) -> AgentResult:
    """Run one prompt; model errors that outlast the retries propagate (the prompt fails).

    With `logprobs`, each saved assistant message keeps the reply's token log probabilities (model.logprobs);
    a `recorder` (--token_ids) is given every kept call: what was sent, the reply, the message saved from it.
    """
    by_name = {t.name: t for t in tools}
    schemas = [t.schema() for t in tools]
    # The system prompt and prefill are sent on every call but never saved.
    prefix = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + list(prefill or [])
    saved: list[dict] = [{"role": "user", "content": prompt}]
    result = AgentResult(messages=saved, tool_schemas=schemas)
    unknown_streak = 0
    while result.api_calls < max_turns:
        limit = ctx.limits.reached()  # time, tokens or cost: no further call
        if limit:
            result.partial, result.stop_reason = True, limit
            return result
        result.api_calls += 1
        try:
            sent = prefix + [_for_api(m) for m in saved]
            response = client.chat(sent, schemas, deadline=ctx.limits.deadline)
        except ContextOverflow:
            result.partial, result.stop_reason = True, "context"
            return result
        except DeadlineReached:
            result.partial, result.stop_reason = True, "time"
            return result
        ctx.usage.add(response.get("usage"))
        choice = response.choices[0]
        calls = choice.message.tool_calls or []
        if any(c.function.name not in by_name for c in calls):
            # Never executed, never saved: the model is asked again with the same conversation.
            unknown_streak += 1
            if unknown_streak >= UNKNOWN_TOOL_LIMIT:
                result.partial, result.stop_reason = True, "invalid_tools"
                return result
            continue
        unknown_streak = 0
        assistant = _assistant(choice, logprobs)
        cut = choice.finish_reason == "length"
        # Some servers omit call ids or send arguments as an object: normalise so ids pair calls with results.
        calls = [
            (c.id or f"call_{result.api_calls}_{i}", c.function.name, _arguments_text(c.function.arguments))
            for i, c in enumerate(calls)
        ]
        if calls and not cut:
            assistant["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in calls
            ]
        saved.append(assistant)
        if recorder is not None:
            recorder.add(sent, schemas, response, assistant)
        if cut:
            # The reply was cut off; its tool calls may be truncated, so none are run or saved
            # (a saved call without a result would count as a failed tool call).
            result.partial, result.stop_reason = True, "length"
            return result
        if not calls:
            result.completed, result.stop_reason = True, "answered"
            return result
        for cid, name, args in calls:
            if ctx.limits.expired():  # the rest of this reply's calls are answered, not run
                output, ok = json.dumps({"error": TIME_LIMIT_MESSAGE}), False
            else:
                output, ok = call_tool(by_name[name], args, ctx)
            saved.append({"role": "tool", "tool_call_id": cid, "name": name, "content": output, "ok": ok})
    result.stop_reason = "max_turns"
    return result


def _assistant(choice, logprobs: bool) -> dict:
    """The assistant message saved from a reply: its content, its reasoning apart, its logprobs if asked for."""
    reasoning, content = split_reasoning(choice.message)
    assistant: dict = {"role": "assistant", "content": content, "reasoning": reasoning}
    if logprobs and (tokens := token_logprobs(choice)):
        assistant["logprobs"] = tokens
    return assistant


def _arguments_text(arguments: Any) -> str:
    if arguments is None:
        return "{}"
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _for_api(message: dict) -> dict:
    """The message as the endpoint expects it (our reasoning, logprobs and ok fields stay local)."""
    if message["role"] == "tool":
        return {k: v for k, v in message.items() if k != "ok"}
    if message["role"] != "assistant":
        return message
    out = {"role": "assistant", "content": message["content"] or None}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out
