"""The token ids one model call saw and sampled (--token_ids), read from the reply in whichever server's shape.

One adapter per shape, chosen by what the reply contains (never by the URL): vLLM's top-level
`prompt_token_ids` and `choices[0].token_ids` (`return_token_ids`), SGLang's `choices[0].prompt_token_ids`
and `response_token_ids` (or its `sglext` block), llama-server's `logprobs.content[].id` (completion ids
only: its chat replies carry no prompt ids; vLLM's `token_id:N` spellings are read the same way). The
embedded model (model/local_server.py) answers in vLLM's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentbatch.model import numbers

# What a chat request adds to ask for them: vLLM and SGLang read `return_token_ids`; llama-server ignores it.
REQUEST_FIELDS = {"return_token_ids": True}
_TOKEN_ID = re.compile(r"token_id:([0-9]+)", re.ASCII)


@dataclass(frozen=True)
class CallTokens:
    """One call's ids: the prompt's (None where the server sends none) and the completion's, with its logprobs."""

    prompt: list[int] | None
    completion: list[int]
    logprobs: list[float | None]  # one per completion id; None where the server gave none
    shape: str  # which adapter read them: "vllm", "sglang", "sglext" or "llama-server"


def _ids(value: Any) -> list[int] | None:
    """A list of token ids, or None if it is not one (bools, negatives and floats are not ids)."""
    if not isinstance(value, list) or not all(type(i) is int and numbers.count(i) is not None for i in value):
        return None
    return list(value)


def _content(choice: dict) -> list[dict]:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    return [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []


def _logprobs(choice: dict, n: int) -> list[float | None]:
    """The completion's logprobs lined up with its n ids; all None when the server's count differs (no guessing)."""
    values = [numbers.real(e.get("logprob")) for e in _content(choice)]
    return values if len(values) == n else [None] * n


def _vllm(reply: dict, choice: dict) -> CallTokens | None:
    prompt, completion = _ids(reply.get("prompt_token_ids")), _ids(choice.get("token_ids"))
    if prompt is None or completion is None:
        return None
    return CallTokens(prompt, completion, _logprobs(choice, len(completion)), "vllm")


def _sglang(reply: dict, choice: dict) -> CallTokens | None:
    prompt = _ids(choice.get("prompt_token_ids"))
    completion = _ids(choice.get("response_token_ids"))
    if completion is None:  # SGLang before its rename (PR #35225), and its completions API
        completion = _ids(choice.get("token_ids"))
    if prompt is None or completion is None:
        return None
    return CallTokens(prompt, completion, _logprobs(choice, len(completion)), "sglang")


def _sglext(reply: dict, choice: dict) -> CallTokens | None:
    ext = reply.get("sglext")
    if not isinstance(ext, dict):
        return None
    outputs = ext.get("output_ids")
    index = choice.get("index") if type(choice.get("index")) is int else 0
    prompt = _ids(ext.get("input_ids"))
    completion = _ids(outputs[index]) if isinstance(outputs, list) and 0 <= index < len(outputs) else None
    if prompt is None or completion is None:
        return None
    return CallTokens(prompt, completion, _logprobs(choice, len(completion)), "sglext")


def _llama_server(reply: dict, choice: dict) -> CallTokens | None:
    """llama-server's `logprobs.content[].id`, or vLLM's tokens spelled `token_id:N` (--return-tokens-as-token-ids)."""
    entries = _content(choice)
    completion = _ids([e["id"] if "id" in e else _spelled(e.get("token")) for e in entries])
    if not entries or completion is None:
        return None
    return CallTokens(None, completion, [numbers.real(e.get("logprob")) for e in entries], "llama-server")


def _spelled(token: Any) -> int | None:
    match = _TOKEN_ID.fullmatch(token) if isinstance(token, str) else None
    return numbers.count(match.group(1)) if match else None


# Tried in this order: the first whose fields the reply holds reads it.
ADAPTERS: tuple[Callable[[dict, dict], CallTokens | None], ...] = (_vllm, _sglang, _sglext, _llama_server)


def call_tokens(reply: Any) -> CallTokens | None:
    """The ids of one reply (its first choice), by the first adapter whose shape it has; None if it has none."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if choice is None:
        return None
    for adapter in ADAPTERS:
        found = adapter(reply, choice)
        if found is not None:
            return found
    return None
