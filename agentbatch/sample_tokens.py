"""A sample's `tokens` (--token_ids): the ids its last model call saw and sampled, which of them the model sampled.

The agent loop hands every kept reply to a TokenRecorder; `tokens()` then builds the trajectory line's field
(docs/output.md, "Token ids"):

    {"source": "endpoint" | "retokenized", "ids": [...], "mask": [0|1...], "logprobs": [float|null...],
     "calls": [{"prompt": n, "completion": m, "policy_version": str|null}], "drift": null | [...]}

`ids` are the last call's prompt ids + completion ids. Each call's prompt must begin with the previous call's
prompt + completion; where it does not (the chat template re-rendered the history otherwise), the place is
recorded in `drift` and the re-rendered ids get mask 0: a 1 is always an id the model sampled. The ids come
from the endpoint (model/token_ids.py) when every call sent them, else all are retokenized with the model's
chat template (retokenize.py): never a mix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from agentbatch.model.token_ids import CallTokens, call_tokens

log = logging.getLogger("batch_runner")


@dataclass
class Call:
    """One kept model call: what was sent (for retokenizing) and the ids the endpoint sent back, if any."""

    messages: list[dict]
    tools: list[dict]
    reply: dict  # the assistant message as saved (content, tool_calls)
    tokens: CallTokens | None
    policy_version: str | None
    cut: bool = False  # the reply was cut by the length limit: the model did not end its turn


@dataclass
class TokenRecorder:
    """The kept model calls of one sample, turned into its `tokens` at the end (module docstring)."""

    tokenizer: str | None  # the chat template's tokenizer (name or directory), for calls without ids
    policy_version: str | None = None
    calls: list[Call] = field(default_factory=list)

    def add(self, messages: list[dict], tools: list[dict], reply: dict, assistant: dict) -> None:
        """Note one kept call: the messages sent, the reply's JSON, the assistant message saved from it."""
        choices = reply.get("choices") if isinstance(reply, dict) else None
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        cut = first.get("finish_reason") == "length"
        self.calls.append(Call(messages, tools, assistant, call_tokens(reply), self.policy_version, cut))

    def tokens(self) -> dict | None:
        """The sample's `tokens`; None with no call, or when its calls have no ids and cannot be retokenized."""
        if not self.calls:
            return None
        exact = [c.tokens for c in self.calls]
        if all(t is not None and t.prompt is not None for t in exact):
            return build(exact, [c.policy_version for c in self.calls], "endpoint")
        import agentbatch.retokenize as retokenize  # transformers, only for endpoints that send no ids

        ids = retokenize.calls(self.tokenizer, self.calls)
        if ids is None:
            return None
        return build(ids, [c.policy_version for c in self.calls], "retokenized")


def build(calls: list[CallTokens], versions: list[str | None], source: str) -> dict:
    """`tokens` from each call's prompt and completion ids, in call order (module docstring)."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float | None] = []
    drift: list[dict] = []
    for k, call in enumerate(calls):
        prompt = call.prompt or []
        keep = _common_prefix(ids, prompt)
        if keep < len(ids):
            at = keep
            drift.append({"call": k, "at": at, "expected": ids[at], "got": prompt[at] if at < len(prompt) else None})
        del ids[keep:], mask[keep:], logprobs[keep:]
        rest = prompt[keep:]
        ids += rest
        mask += [0] * len(rest)
        logprobs += [None] * len(rest)
        ids += call.completion
        mask += [1] * len(call.completion)
        logprobs += list(call.logprobs)
    return {
        "source": source,
        "ids": ids,
        "mask": mask,
        "logprobs": logprobs,
        "calls": [
            {"prompt": len(c.prompt or []), "completion": len(c.completion), "policy_version": v}
            for c, v in zip(calls, versions, strict=True)
        ],
        "drift": drift or None,
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
