"""The quality filters: which finished samples are discarded.

The `quality` group of the settings (settings.QualityFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag

FLAGS: tuple[Flag, ...] = (
    Flag(
        "require_reasoning",
        True,
        "discard samples without any reasoning; false for models that never reason",
        check.boolean,
        group="quality",
    ),
    Flag(
        "require_pass",
        False,
        'discard samples whose check did not pass (rows need `verify` or `answer`, see "Verified outcomes")',
        check.boolean,
        group="quality",
    ),
)
