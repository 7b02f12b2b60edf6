"""The run's budget (--budget_usd, --budget_tokens; docs/limits.md).

What the run has spent is read from its files when a session starts (run_dir's reader, RunReader.spend: the
batch files, discarded.jsonl and failed.jsonl, every attempt that was paid for) and grows as this session's
samples finish. A sample may start only while what is spent, plus the projected cost of the samples in
flight and of this one, stays within the budget; running samples always finish. The projection is the mean
spend of the paid attempts so far (those that spent anything: a failed setup, a missing image or a refused
request costs nothing and says nothing about what a sample costs), with a margin that shrinks as more of
them finish, and never more than a per-sample limit; before any paid attempt has finished one sample runs at
a time (or, with a per-sample limit, as many as the limit allows), so even the first wave cannot overrun.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentbatch.run_dir.spend import Spend


@dataclass(frozen=True)
class BudgetSettings:
    """The flags: the run's budgets, and the per-sample limits (--max_*_per_prompt) bounding one sample's spend."""

    usd: float | None = None
    tokens: int | None = None
    usd_per_prompt: float | None = None
    tokens_per_prompt: int | None = None

    @property
    def active(self) -> bool:
        return self.usd is not None or self.tokens is not None


class Budget:
    """The run's spend against its budgets, and whether another sample may start."""

    def __init__(self, settings: BudgetSettings, spent: Spend):
        self.settings = settings
        self.spent = spent
        self.stopped = False  # set by the session once the budget kept a sample from starting for good

    def add(self, usage: dict | None) -> None:
        """A sample finished (done, discarded or failed): what it spent counts."""
        self.spent.add(usage)

    def may_start(self, in_flight: int) -> bool:
        """Whether one more sample fits, `in_flight` samples running."""
        s, spent = self.settings, self.spent
        return _fits(s.usd, spent.cost, spent.paid, s.usd_per_prompt, in_flight) and _fits(
            s.tokens, spent.tokens, spent.paid, s.tokens_per_prompt, in_flight
        )

    def samples_left(self, in_flight: int) -> int | None:
        """How many more samples the budget is projected to let start, besides those in flight; None: no bound."""
        n = None
        for limit, spent, mean in (
            (self.settings.usd, self.spent.cost, self.mean_cost()),
            (self.settings.tokens, self.spent.tokens, self.mean_tokens()),
        ):
            if limit is None or not mean:
                continue
            left = max(0, math.floor((limit - spent) / mean) - in_flight)
            n = left if n is None else min(n, left)
        return n

    def mean_cost(self) -> float | None:
        """The mean cost of a paid attempt; None before one has finished."""
        return self.spent.cost / self.spent.paid if self.spent.paid else None

    def mean_tokens(self) -> float | None:
        return self.spent.tokens / self.spent.paid if self.spent.paid else None

    def describe(self) -> str:
        """The budget and its spend, for the summary: "$4.98 of $5.00, 120000 of 200000 tokens"."""
        parts = []
        if self.settings.usd is not None:
            parts.append(f"${self.spent.cost:.4f} of ${self.settings.usd:g}")
        if self.settings.tokens is not None:
            parts.append(f"{self.spent.tokens} of {self.settings.tokens} tokens")
        return ", ".join(parts)


def _fits(limit, spent, paid: int, per_sample_cap, in_flight: int) -> bool:
    if limit is None:
        return True
    if spent >= limit:
        return False
    if paid == 0:
        if per_sample_cap is None:
            return in_flight == 0  # nothing known yet: one sample at a time until one has spent something
        return spent + (in_flight + 1) * per_sample_cap <= limit
    # A mean over few samples may be far off: project more than it, less so as more samples finish; a
    # per-sample limit bounds what each sample can spend, whatever the mean says.
    each = spent / paid * (1 + 2 / math.sqrt(paid))
    if per_sample_cap is not None:
        each = min(each, per_sample_cap)
    return spent + (in_flight + 1) * each <= limit
