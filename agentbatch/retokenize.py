"""Token ids for an endpoint that sends none (--token_ids): each call rendered with the model's chat template.

Not what the model sampled: the reply's text encoded again, which can differ from the sampled ids (a text has
several encodings). So such a sample's `tokens` say `source: "retokenized"`, and logprobs are null (the
endpoint's, if any, belong to ids we do not have). A call's completion is the suffix its reply adds to its
prompt's render, up to the template's end-of-turn token (TRL and verl cut it the same way; a reply cut by the
length limit without it: the model never ended that turn); a template that is not prefix-preserving shows as
drift (sample_tokens.build). Needs transformers; a tokenizer that cannot be loaded (no transformers, no such
name offline, a GGUF file without torch or gguf) leaves the sample's tokens null, said once per process in
one line.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from typing import Any

from agentbatch.model.token_ids import CallTokens

log = logging.getLogger("batch_runner")
# What transformers needs to read a GGUF file's tokenizer: the `gguf` parser, and torch, which its GGUF reader
# (integrations/gguf/reader.py, transformers 5.24) imports at its top though a tokenizer uses none of it.
GGUF_NEEDS = ("torch", "gguf")


def calls(tokenizer: str | None, recorded: list) -> list[CallTokens] | None:
    """Each recorded call (sample_tokens.Call) as prompt + completion ids of its render; None without a tokenizer."""
    tok = _load(tokenizer) if tokenizer else None
    if tok is None:
        return None
    out = []
    for call in recorded:
        messages = [_plain(m) for m in call.messages]
        prompt = _render(tok, messages, call.tools, True)
        full = _render(tok, messages + [_plain(dict(call.reply, role="assistant"))], call.tools, False)
        if full[: len(prompt)] == prompt:
            completion = _to_end_of_turn(full[len(prompt) :], tok.eos_token_id)
        else:  # the template renders a finished turn unlike its generation prompt: the reply's text alone
            completion = tok.encode(call.reply.get("content") or "", add_special_tokens=False)
        if call.cut and completion[-1:] == [tok.eos_token_id]:  # the template ends the turn; the model did not
            completion = completion[:-1]
        out.append(CallTokens(prompt, completion, [None] * len(completion), "retokenized"))
    return out


def _plain(message: dict) -> dict:
    """The message as a chat template expects it (our local fields out, content never None)."""
    out = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
    out["content"] = out.get("content") or ""
    return out


def _render(tok: Any, messages: list[dict], tools: list[dict], generation: bool) -> list[int]:
    encoded = tok.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def _to_end_of_turn(ids: list[int], eos: int | None) -> list[int]:
    """Up to and with the first end-of-turn id (the model stops there; the template's newline after is not its)."""
    if eos is not None and eos in ids:
        return ids[: ids.index(eos) + 1]
    return ids


@functools.lru_cache(maxsize=4)
def _load(name: str) -> Any:
    """The tokenizer, once per process; None (said once, in one line) when it cannot be loaded."""
    try:
        from transformers import AutoTokenizer

        if name.endswith(".gguf"):
            missing = [m for m in GGUF_NEEDS if importlib.util.find_spec(m) is None]
            if missing:
                raise ImportError(
                    f"transformers reads a GGUF file's tokenizer only with {' and '.join(GGUF_NEEDS)}"
                    f" ({', '.join(missing)} not installed)"
                )
            return AutoTokenizer.from_pretrained(os.path.dirname(name) or ".", gguf_file=os.path.basename(name))
        return AutoTokenizer.from_pretrained(name)
    except Exception as e:  # ImportError, OSError (not found offline), a GGUF without torch or gguf: all the same to us
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        log.warning("--token_ids: cannot retokenize with %r (%s): such samples' tokens are null", name, reason)
        return None
