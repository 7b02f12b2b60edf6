"""The run's budget (--budget_usd, --budget_tokens; README "Limits, cost and budget").

What the run has spent is read from its files when a session starts (the batch files, discarded.jsonl and
failed.jsonl: every attempt that was paid for) and grows as this session's prompts finish. A prompt may
start only while what is spent, plus the projected cost of the prompts in flight and of this one, stays
within the budget; running prompts always finish. The projection is the mean spend of the prompts finished
so far, with a margin that shrinks as more of them finish; before any has finished one prompt runs at a
time (or, with a per-prompt limit, as many as the limit allows), so even the first wave cannot overrun.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agentbatch.model.usage import cost_of
from agentbatch.run_files import RunFiles, iter_records


@dataclass(frozen=True)
class BudgetSettings:
    """The flags: the run's budgets, and the per-prompt limits that bound what one prompt can spend."""

    usd: float | None = None
    tokens: int | None = None
    usd_per_prompt: float | None = None
    tokens_per_prompt: int | None = None

    @property
    def active(self) -> bool:
        return self.usd is not None or self.tokens is not None


@dataclass
class Spend:
    """USD and tokens spent over some finished attempts."""

    cost: float = 0.0
    tokens: int = 0
    attempts: int = 0

    def add(self, usage: dict | None) -> None:
        self.cost += cost_of(usage)
        self.tokens += int((usage or {}).get("total_tokens") or 0)
        self.attempts += 1


def spent_in(files: RunFiles) -> Spend:
    """What the sessions before this one spent, from every line of the run's files."""
    spend = Spend()
    paths = [files.batch_path(n) for n in files.batch_numbers()]
    for path in (*paths, files.path("discarded.jsonl"), files.path("failed.jsonl")):
        for record in iter_records(path):
            spend.add(record.get("usage"))
    return spend


class Budget:
    """The run's spend against its budgets, and whether another prompt may start."""

    def __init__(self, settings: BudgetSettings, spent: Spend):
        self.settings = settings
        self.spent = spent
        self.stopped = False  # set by the session once the budget kept a prompt from starting for good

    def add(self, usage: dict | None) -> None:
        """A prompt finished (done, discarded or failed): what it spent counts."""
        self.spent.add(usage)

    def may_start(self, in_flight: int) -> bool:
        """Whether one more prompt fits, `in_flight` prompts running."""
        s, spent = self.settings, self.spent
        return _fits(s.usd, spent.cost, spent, s.usd_per_prompt, in_flight, lambda sp: sp.cost) and _fits(
            s.tokens, spent.tokens, spent, s.tokens_per_prompt, in_flight, lambda sp: sp.tokens
        )

    def prompts_left(self, in_flight: int) -> int | None:
        """How many more prompts the budget is projected to let start, besides those in flight; None: no bound."""
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
        return self.spent.cost / self.spent.attempts if self.spent.attempts else None

    def mean_tokens(self) -> float | None:
        return self.spent.tokens / self.spent.attempts if self.spent.attempts else None

    def describe(self) -> str:
        """The budget and its spend, for the summary: "$4.98 of $5.00, 120000 of 200000 tokens"."""
        parts = []
        if self.settings.usd is not None:
            parts.append(f"${self.spent.cost:.4f} of ${self.settings.usd:g}")
        if self.settings.tokens is not None:
            parts.append(f"{self.spent.tokens} of {self.settings.tokens} tokens")
        return ", ".join(parts)


def _fits(limit, spent, so_far: Spend, per_prompt_cap, in_flight: int, amount) -> bool:
    if limit is None:
        return True
    if spent >= limit:
        return False
    if so_far.attempts == 0:
        if per_prompt_cap is None:
            return in_flight == 0  # nothing known yet: one prompt at a time until one has finished
        return spent + (in_flight + 1) * per_prompt_cap <= limit
    mean = amount(so_far) / so_far.attempts
    # A mean over few prompts may be far off: project more than it, less so as more prompts finish.
    margin = 1 + 2 / math.sqrt(so_far.attempts)
    return spent + (in_flight + 1) * mean * margin <= limit
