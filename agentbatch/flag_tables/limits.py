"""Each sample's limits (docs/limits.md), and the bounds they set on a task's own.

The `limits` group of the settings (settings.LimitFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag, integer, optional
from agentbatch.model import numbers

FLAGS: tuple[Flag, ...] = (
    Flag("max_turns", 10, "model calls per sample", integer(1, 1_000_000), group="limits"),
    Flag(
        "max_tokens_per_prompt",
        None,
        "tokens (prompt + completion, all calls) after which a sample makes no further model call: `partial`, stop_reason `tokens`",
        optional(integer(1, numbers.MAX_COUNT)),
        kind=int,
        group="limits",
    ),
    Flag(
        "max_cost_per_prompt",
        None,
        "USD after which a sample makes no further model call: `partial`, stop_reason `cost`",
        optional(check.usd),
        kind=float,
        group="limits",
    ),
    Flag(
        "prompt_timeout",
        None,
        "seconds a sample may run, tools included; its model call or command is cut then: `partial`, stop_reason `time`",
        optional(check.seconds),
        kind=float,
        group="limits",
    ),
    Flag("check_timeout", 300.0, "seconds a row's `setup` or `verify` command may run", check.seconds, group="limits"),
    Flag(
        "timeout_multiplier",
        1.0,
        "scales each Harbor task's own agent, verifier and build timeouts (slow machines)",
        check.number(0, 100, "a factor", above=True),
        group="limits",
    ),
)
