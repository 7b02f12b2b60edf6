"""A model that answers from a script: for tests of the agent loop, of tools and of plug-ins, with no endpoint.

    model = ScriptedModel([
        {"tool_calls": [{"name": "terminal", "arguments": {"command": "ls"}}]},
        {"content": "done", "reasoning": "it listed the files"},
    ])

Each chat takes the next reply of the script (the last one repeats once it runs out). A reply is either a
whole OpenAI chat completion (with `choices`) or the shorthand above: `content`, `reasoning`, `tool_calls`
(each a `name` and `arguments` as an object or a JSON string), `finish_reason` and `usage`. A callable in the
script is called with the messages and returns such a reply.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable

from agentbatch.model.base import ModelCallError, Reply

Scripted = dict | Callable[[list[dict]], dict]


class ScriptedModel:
    """Replies from a list, in order; safe to share between threads. `calls` keeps every request it was sent."""

    def __init__(self, replies: Iterable[Scripted]):
        self._replies = list(replies)
        if not self._replies:
            raise ValueError("a scripted model needs at least one reply")
        self._next = 0
        self._lock = threading.Lock()
        self.calls: list[dict] = []

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        model: str | None = None,
        deadline: float | None = None,
    ) -> Reply:
        with self._lock:
            spec = self._replies[min(self._next, len(self._replies) - 1)]
            self._next += 1
            self.calls.append({"messages": list(messages), "tools": tools, "model": model})
        if callable(spec):
            spec = spec(messages)
        return completion(spec)

    def generate_image(self, request: dict, deadline: float | None = None) -> Reply:
        raise ModelCallError("a scripted model makes no images")


def completion(spec: dict) -> Reply:
    """A chat completion from a reply spec (a whole completion passes through)."""
    if "choices" in spec:
        return Reply(spec)
    message: dict = {"role": "assistant", "content": spec.get("content")}
    if spec.get("reasoning"):
        message["reasoning"] = spec["reasoning"]
    calls = spec.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {
                "id": call.get("id") or f"call_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": _text(call.get("arguments", {}))},
            }
            for i, call in enumerate(calls)
        ]
    finish = spec.get("finish_reason") or ("tool_calls" if calls else "stop")
    usage = spec.get("usage") or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    return Reply({"choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})


def _text(arguments) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
