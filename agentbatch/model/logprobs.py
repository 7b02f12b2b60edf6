"""Token log probabilities of a reply (--logprobs), in the form a trajectory's gpt turn carries them.

OpenAI-compatible servers return them as `choice.logprobs.content`: one {token, logprob, ...} per generated
token. Token ids come only from servers that send them: vLLM's `choice.token_ids` (`return_token_ids`), or
tokens spelled `token_id:N` (vLLM started with `--return-tokens-as-token-ids`).
"""

from __future__ import annotations

import re
from typing import Any

from agentbatch.model import numbers

_TOKEN_ID = re.compile(r"token_id:([0-9]+)", re.ASCII)


def token_logprobs(choice: Any) -> dict | None:
    """{"tokens", "logprobs", "token_ids"} of one reply, lists in generation order; None if the server sent none.

    A logprob that is not a finite number (a server's -inf, an int past float's range) becomes null: JSON has
    no infinity.
    token_ids is empty when the server did not send ids.
    """
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    entries = [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []
    sent_ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not entries and not sent_ids:
        return None
    tokens = [e.get("token") if isinstance(e.get("token"), str) else "" for e in entries]
    values = [numbers.real(e.get("logprob")) for e in entries]
    if isinstance(sent_ids, list) and all(type(i) is int and numbers.count(i) is not None for i in sent_ids):
        ids = list(sent_ids)
    else:
        spelled = [numbers.count(m.group(1)) if (m := _TOKEN_ID.fullmatch(t)) else None for t in tokens]
        ids = spelled if tokens and None not in spelled else []
    return {"tokens": tokens, "logprobs": values, "token_ids": ids}
