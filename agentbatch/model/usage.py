"""Token counts of a prompt, summed over every model call it makes (the tools' calls included)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Usage:
    """Token counts; add() is safe from several threads (mixture_of_agents asks its models at once)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, usage: Any) -> None:
        """Add a reply's `usage` object; missing or non-numeric counts are zero."""
        if not isinstance(usage, dict):
            return
        p, c = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
        total = _count(usage.get("total_tokens")) or p + c
        with self._lock:
            self.prompt_tokens += p
            self.completion_tokens += c
            self.total_tokens += total

    def as_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


def _count(value: Any) -> int:
    """A token count as servers send it (a number, sometimes a numeric string); anything else is 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if value.isdigit() else 0
    if isinstance(value, float) and value == value and value != float("inf"):
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else 0
