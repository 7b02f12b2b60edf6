"""Reasoning, wherever a provider puts it: message fields or tagged blocks in the content."""

from __future__ import annotations

import re
from typing import Any

_BLOCK = re.compile(r"<(REASONING_SCRATCHPAD|think)>(.*?)(?:</\1>|\Z)", re.DOTALL | re.IGNORECASE)


def split_reasoning(message: dict) -> tuple[str, str]:
    """(reasoning, content without reasoning blocks) of an assistant message as the endpoint sent it."""
    content = message.get("content") or ""
    if not isinstance(content, str):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    parts: list[str] = []
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if isinstance(value, str) and value.strip():
            parts.append(value.strip())
            break  # providers often send both with the same text
    if not parts:
        parts.extend(_details_text(message.get("reasoning_details")))
    blocks = [m.group(2).strip() for m in _BLOCK.finditer(content)]
    parts.extend(b for b in blocks if b)
    if blocks:
        content = _BLOCK.sub("", content).strip()
    return "\n\n".join(parts), content


def _details_text(details: Any) -> list[str]:
    out = []
    for d in details if isinstance(details, list) else []:
        if not isinstance(d, dict):
            continue
        text = d.get("text") or d.get("summary") or ""
        if isinstance(text, list):
            text = "\n".join(str(t) for t in text)
        if isinstance(text, str) and text.strip():
            out.append(text.strip())
    return out
