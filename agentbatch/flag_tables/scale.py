"""How many samples run at once, and where (this machine's worker processes, or a Ray cluster).

The `scale` group of the settings (settings.ScaleFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag, integer, optional, text_flag

# Samples in flight (and sandboxes started at once): capacity.py finds how many this machine can hold.
MAX_SAMPLES_IN_FLIGHT = 1_000_000

FLAGS: tuple[Flag, ...] = (
    Flag(
        "num_workers",
        4,
        "samples in flight, one per slot (a thread); the slots share worker processes, at most one per core "
        "unless the open-file limit asks for more (see Scale)",
        integer(1, MAX_SAMPLES_IN_FLIGHT),
        group="scale",
    ),
    Flag(
        "concurrency",
        None,
        "samples in flight, when given: overrides --num_workers (1,024 work on 2 cores); model calls are paced "
        "below it when the endpoint answers 429 or is overloaded",
        optional(integer(1, MAX_SAMPLES_IN_FLIGHT)),
        shown_default="num_workers",
        kind=int,
        group="scale",
    ),
    Flag(
        "sandbox_starts",
        None,
        "sandboxes being created at once over all workers (container starts are paced apart from the samples)",
        optional(integer(1, MAX_SAMPLES_IN_FLIGHT)),
        shown_default="2 × cores",
        kind=int,
        group="scale",
    ),
    text_flag(
        "ray_address",
        None,
        "run on a Ray cluster: `local`, `auto` or `ray://host:port`",
        check.ray_address,
        group="scale",
    ),
)
