"""What finished attempts spent: USD and tokens from their lines' `usage`, and how many spent anything."""

from __future__ import annotations

from dataclasses import dataclass

from agentbatch.model.usage import cost_of


@dataclass
class Spend:
    """USD and tokens spent over some finished attempts, and how many of them spent anything."""

    cost: float = 0.0
    tokens: int = 0
    attempts: int = 0
    paid: int = 0

    def add(self, usage: object) -> None:
        cost, tokens = cost_of(usage), tokens_of(usage)
        self.cost += cost
        self.tokens += tokens
        self.attempts += 1
        self.paid += cost > 0 or tokens > 0


def tokens_of(usage: object) -> int:
    """The total tokens of a saved `usage` object; 0 for anything but a whole number (a hand edit, a foreign line)."""
    value = usage.get("total_tokens") if isinstance(usage, dict) else None
    return value if type(value) is int and value > 0 else 0
