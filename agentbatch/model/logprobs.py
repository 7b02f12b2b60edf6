"""Token log probabilities of a reply (--logprobs), in the form a trajectory's gpt turn carries them.

OpenAI-compatible servers return them as `choice.logprobs.content`: one {token, logprob, ...} per generated
token. Token ids come only from servers that send them: vLLM's `choice.token_ids` (`return_token_ids`), or
tokens spelled `token_id:N` (vLLM started with `--return-tokens-as-token-ids`).
"""

from __future__ import annotations

import math
import re
from typing import Any

_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def token_logprobs(choice: Any) -> dict | None:
    """{"tokens", "logprobs", "token_ids"} of one reply, lists in generation order; None if the server sent none.

    A logprob that is not a finite number (a server's -inf) becomes null: JSON has no infinity.
    token_ids is empty when the server did not send ids.
    """
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    entries = [e for e in content if isinstance(e, dict)] if isinstance(content, list) else []
    sent_ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if not entries and not sent_ids:
        return None
    tokens = [e.get("token") if isinstance(e.get("token"), str) else "" for e in entries]
    values = [_finite(e.get("logprob")) for e in entries]
    if isinstance(sent_ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in sent_ids):
        ids = list(sent_ids)
    else:
        spelled = [_TOKEN_ID.match(t) for t in tokens]
        ids = [int(m.group(1)) for m in spelled] if tokens and all(spelled) else []
    return {"tokens": tokens, "logprobs": values, "token_ids": ids}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
