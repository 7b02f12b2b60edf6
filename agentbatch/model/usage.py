"""Token counts and cost of a sample, summed over every model call it makes (the tools' calls included)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from agentbatch.model import numbers

# Costs are kept to a ten-billionth of a dollar: far below any price, and sums of them print without float noise.
COST_DIGITS = 10


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (--price_input / --price_output), for calls whose endpoint reports no cost."""

    input: float = 0.0
    output: float = 0.0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1_000_000


@dataclass
class Usage:
    """Token counts and USD cost; add() is safe from several threads (mixture_of_agents asks its models at once).

    A call's cost is what the endpoint reported in its `usage.cost` (OpenRouter's usage accounting), else the
    tokens at `prices`; with neither it is 0.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    cached_calls: int = 0  # calls the model-call cache answered (model/cache.py): no tokens, no cost
    # What those cached replies cost when they were paid for: the sample's own token and cost limits count it,
    # so a replay stops where the paid run stopped; the line, the statistics and the budget do not.
    replayed_tokens: int = field(default=0, compare=False)
    replayed_cost: float = field(default=0.0, compare=False)
    prices: Prices = field(default_factory=Prices, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, usage: Any) -> None:
        """Add a reply's `usage` object; a count or cost that is missing or not one (model.numbers) is not sent."""
        counted = self._read(usage)
        if counted is None:
            return
        p, c, total, cost = counted
        with self._lock:
            self.prompt_tokens += p
            self.completion_tokens += c
            self.total_tokens += total
            self.cost += cost

    def add_cached(self, usage: Any) -> None:
        """A call the cache answered; `usage` is what its reply's call reported when it was paid for."""
        p, c, total, cost = self._read(usage) or (0, 0, 0, 0.0)
        with self._lock:
            self.cached_calls += 1
            self.replayed_tokens += total
            self.replayed_cost += cost

    def _read(self, usage: Any) -> tuple[int, int, int, float] | None:
        if not isinstance(usage, dict):
            return None
        p = numbers.count(usage.get("prompt_tokens")) or 0
        c = numbers.count(usage.get("completion_tokens")) or 0
        total = numbers.count(usage.get("total_tokens")) or p + c
        reported = numbers.usd(usage.get("cost"))
        return p, c, total, reported if reported is not None else self.prices.cost(p, c)

    def limit_tokens(self) -> int:
        """The tokens a sample's token limit counts: those paid for now, and those its cached replies cost once."""
        return self.total_tokens + self.replayed_tokens

    def limit_cost(self) -> float:
        return self.cost + self.replayed_cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cost": round(self.cost, COST_DIGITS),
            "cached_calls": self.cached_calls,
        }


def cost_of(usage: Any) -> float:
    """The cost recorded in a saved `usage` object (0.0 for lines written before costs were recorded)."""
    value = numbers.usd(usage.get("cost")) if isinstance(usage, dict) else None
    return value or 0.0
