"""Reasoning, wherever a provider puts it: message fields or tagged blocks in the content."""

from __future__ import annotations

import re
from typing import Any

_BLOCK = re.compile(r"<(REASONING_SCRATCHPAD|think)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)


def split_reasoning(message: Any) -> tuple[str, str]:
    """(reasoning, content without reasoning blocks) of an assistant message (openai object or dict)."""
    get = message.get if isinstance(message, dict) else lambda k: _field(message, k)
    content = get("content") or ""
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    parts: list[str] = []
    for key in ("reasoning", "reasoning_content"):
        value = get(key)
        if isinstance(value, str) and value.strip():
            parts.append(value.strip())
            break  # providers often send both with the same text
    if not parts:
        parts.extend(_details_text(get("reasoning_details")))
    blocks = [m.group(2).strip() for m in _BLOCK.finditer(content)]
    parts.extend(b for b in blocks if b)
    if blocks:
        content = _BLOCK.sub("", content).strip()
    return "\n\n".join(parts), content


def with_think_block(reasoning: str, content: str) -> str:
    """The ShareGPT gpt value: reasoning first as a <think> block, then the content."""
    if not reasoning:
        return content
    return f"<think>\n{reasoning}\n</think>\n{content}" if content else f"<think>\n{reasoning}\n</think>"


def has_think_block(value: str) -> bool:
    return value.startswith("<think>\n")


def _details_text(details: Any) -> list[str]:
    out = []
    for d in details or []:
        if not isinstance(d, dict):
            d = getattr(d, "model_dump", lambda: {})()
        text = d.get("text") or d.get("summary") or ""
        if isinstance(text, list):
            text = "\n".join(str(t) for t in text)
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return out


def _field(obj: Any, key: str) -> Any:
    value = getattr(obj, key, None)
    if value is None:
        extra = getattr(obj, "model_extra", None) or {}
        value = extra.get(key)
    return value
