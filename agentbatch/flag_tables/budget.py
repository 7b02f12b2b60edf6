"""The run's budgets, and the prices its costs are computed with where the endpoint reports none.

The `budget` group of the settings (settings.BudgetFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag, integer, optional

FLAGS: tuple[Flag, ...] = (
    Flag(
        "price_input",
        None,
        "USD per million prompt tokens, for the cost of calls whose endpoint reports none",
        optional(check.price),
        kind=float,
        group="budget",
    ),
    Flag(
        "price_output",
        None,
        "USD per million completion tokens, for the cost of calls whose endpoint reports none",
        optional(check.price),
        kind=float,
        group="budget",
    ),
    Flag(
        "budget_usd",
        None,
        'spend of the whole run, earlier sessions included, past which no new sample starts (see "Limits, cost and budget")',
        optional(check.usd),
        kind=float,
        group="budget",
    ),
    Flag(
        "budget_tokens",
        None,
        "tokens of the whole run, earlier sessions included, past which no new sample starts",
        optional(integer(1, 10**15)),
        kind=int,
        group="budget",
    ),
)
