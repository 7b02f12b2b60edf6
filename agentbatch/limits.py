"""Per-sample limits beyond --max_turns: wall time, tokens and cost of one sample (docs/limits.md).

The flags say "per prompt" (--prompt_timeout, --max_tokens_per_prompt, --max_cost_per_prompt): each sample
of a prompt has them whole. The agent loop checks them before each model call and stops the sample as
`partial` with the limit as its `stop_reason` (time, tokens, cost). The deadline also cuts what is running
when it comes: a model call's timeout and every tool's (each `*_timeout` a tool reads from
`ToolContext.settings` is cut to `time_left()`) are never longer than the time left, so nothing outlives
the sample.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from agentbatch.model.usage import Usage

TIME_LIMIT_MESSAGE = "not run: the sample's time limit was reached"
CANCELLED = "cancelled: its rollouts' caller stopped them"


@dataclass(frozen=True)
class PromptLimits:
    """The run's per-sample limits (--prompt_timeout, --max_tokens_per_prompt, --max_cost_per_prompt); None: none."""

    seconds: float | None = None
    tokens: int | None = None
    cost: float | None = None


class SampleLimits:
    """One running sample's limits: its deadline, and the usage its token and cost limits are checked against."""

    def __init__(
        self,
        limits: PromptLimits | None = None,
        usage: Usage | None = None,
        start: float | None = None,
        cancelled: threading.Event | None = None,
    ):
        self.limits = limits or PromptLimits()
        self.usage = usage if usage is not None else Usage()
        start = time.monotonic() if start is None else start
        self.deadline: float | None = None if self.limits.seconds is None else start + self.limits.seconds
        # Set when the sample's caller cancels it (a rollouts client gone): from then on its deadline has passed.
        self.cancelled = cancelled or threading.Event()

    def time_left(self) -> float | None:
        """Seconds until the deadline (0 once passed or cancelled); None without a time limit."""
        if self.cancelled.is_set():
            return 0.0
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def cap(self, seconds: float) -> float:
        """`seconds`, or the time left if the deadline comes sooner."""
        left = self.time_left()
        return seconds if left is None else min(seconds, left)

    def expired(self) -> bool:
        return self.cancelled.is_set() or (self.deadline is not None and time.monotonic() >= self.deadline)

    def reached(self) -> str | None:
        """The limit that forbids another model call: "time", "tokens" or "cost"; None while none does."""
        if self.expired():
            return "time"
        if self.limits.tokens is not None and self.usage.limit_tokens() >= self.limits.tokens:
            return "tokens"
        if self.limits.cost is not None and self.usage.limit_cost() >= self.limits.cost:
            return "cost"
        return None


@dataclass(frozen=True)
class TaskLimits:
    """A task's own time limits, as its dataset format gives them (docs/datasets.md); None: the run's flag applies.

    `prompt_timeout` is its samples' time limit (as --prompt_timeout), `check_timeout` its setup's and check's
    (as --check_timeout). Before any sample the runner bounds them by the run's flags (TimeoutBounds).
    """

    prompt_timeout: float | None = None
    check_timeout: float | None = None


@dataclass(frozen=True)
class TimeoutBounds:
    """The run's flags over every task's own limits: --timeout_multiplier scales them (a build's too), and a
    --prompt_timeout or --check_timeout given on the command line lowers them (None: not given)."""

    multiplier: float = 1.0
    prompt_timeout: float | None = None
    check_timeout: float | None = None

    def scaled(self, seconds: float) -> float:
        return seconds * self.multiplier

    def bound(self, own: TaskLimits) -> TaskLimits:
        """The sample's limits from the task's own: scaled, then lowered by a flag given; None stays None."""
        if own.prompt_timeout is None and own.check_timeout is None:
            return own
        return TaskLimits(
            _lower(self._scaled(own.prompt_timeout), self.prompt_timeout),
            _lower(self._scaled(own.check_timeout), self.check_timeout),
        )

    def _scaled(self, seconds: float | None) -> float | None:
        return None if seconds is None else self.scaled(seconds)


def _lower(own: float | None, flag: float | None) -> float | None:
    if own is None:
        return None
    return min(own, flag) if flag is not None else own
