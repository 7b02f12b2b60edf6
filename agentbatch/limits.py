"""Per-sample limits beyond --max_turns: wall time, tokens and cost of one sample (docs/limits.md).

The flags say "per prompt" (--prompt_timeout, --max_tokens_per_prompt, --max_cost_per_prompt): each sample
of a prompt has them whole. The agent loop checks them before each model call and stops the sample as
`partial` with the limit as its `stop_reason` (time, tokens, cost). The deadline also cuts what is running
when it comes: a model call's timeout and every tool's (each `*_timeout` a tool reads from
`ToolContext.settings` is cut to `time_left()`) are never longer than the time left, so nothing outlives
the sample.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from agentbatch.model.usage import Usage

TIME_LIMIT_MESSAGE = "not run: the prompt's time limit was reached"


@dataclass(frozen=True)
class PromptLimits:
    """The run's per-prompt limits (--prompt_timeout, --max_tokens_per_prompt, --max_cost_per_prompt); None: none."""

    seconds: float | None = None
    tokens: int | None = None
    cost: float | None = None


class SampleLimits:
    """One running sample's limits: its deadline, and the usage its token and cost limits are checked against."""

    def __init__(self, limits: PromptLimits | None = None, usage: Usage | None = None, start: float | None = None):
        self.limits = limits or PromptLimits()
        self.usage = usage if usage is not None else Usage()
        start = time.monotonic() if start is None else start
        self.deadline: float | None = None if self.limits.seconds is None else start + self.limits.seconds

    def time_left(self) -> float | None:
        """Seconds until the deadline (0 once passed); None without a time limit."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def cap(self, seconds: float) -> float:
        """`seconds`, or the time left if the deadline comes sooner."""
        left = self.time_left()
        return seconds if left is None else min(seconds, left)

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def reached(self) -> str | None:
        """The limit that forbids another model call: "time", "tokens" or "cost"; None while none does."""
        if self.expired():
            return "time"
        if self.limits.tokens is not None and self.usage.total_tokens >= self.limits.tokens:
            return "tokens"
        if self.limits.cost is not None and self.usage.cost >= self.limits.cost:
            return "cost"
        return None
