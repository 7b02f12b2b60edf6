"""Which sandbox the samples get, and its limits (bwrap's rlimits, docker's container limits).

The `sandbox` group of the settings (settings.SandboxFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag, integer, text_flag

MAX_PIDS = 4_194_304  # Linux's most process ids (pid_max)

FLAGS: tuple[Flag, ...] = (
    Flag(
        "keep_final_state",
        False,
        "keep each sample's sandbox as its agent left it (its work directory, or what changed in its container) in "
        "<run>/final_state/, so that --rescore can run its check again (see docs/replay.md)",
        check.boolean,
        group="sandbox",
    ),
    text_flag(
        "sandbox",
        None,
        "bwrap, local or docker (see Sandboxes); rows with an image always use docker",
        check.sandbox_kind,
        shown="`TERMINAL_ENV`, else bwrap if it works here, else local",
        group="sandbox",
    ),
    text_flag(
        "sandbox_network",
        "on",
        "`none`: bwrap and docker sandboxes get no network (local cannot)",
        check.network,
        group="sandbox",
    ),
    text_flag(
        "sandbox_memory",
        "1g",
        "bwrap: data size (heap, private mappings) of each process",
        check.size("16m"),
        group="sandbox",
    ),
    Flag("sandbox_processes", 256, "bwrap: processes of one command at once", integer(1, MAX_PIDS), group="sandbox"),
    text_flag("sandbox_file_size", "1g", "bwrap: largest file a command may write", check.size("1m"), group="sandbox"),
    Flag(
        "sandbox_cpu_seconds",
        600,
        "bwrap: CPU seconds of each process",
        integer(1, int(check.MAX_SECONDS)),
        group="sandbox",
    ),
    text_flag("docker_image", "python:3.11-slim", "default image of the docker sandbox", group="sandbox"),
    text_flag(
        "docker_memory", "1g", "container memory limit (no swap beyond it)", check.docker_memory, group="sandbox"
    ),
    Flag("docker_cpus", 1.0, "container CPU limit", check.number(0.01, 1024, "a number of CPUs"), group="sandbox"),
    Flag("docker_pids", 256, "container process limit", integer(1, MAX_PIDS), group="sandbox"),
)
