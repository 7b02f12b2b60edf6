"""The run and its dataset: where it is written, which rows, how many samples of each, how it is shown.

The `run` group of the settings (settings.RunFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

from typing import Any

import agentbatch.flag_checks as check
from agentbatch.errors import FatalError
from agentbatch.flag_type import Flag, integer, optional, text_flag


def _seed(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FatalError(f"--{name} must be a whole number, got {check.shown(value)}")
    return value


FLAGS: tuple[Flag, ...] = (
    text_flag(
        "dataset_file",
        None,
        'JSONL file, one {"prompt": ...} object per line (see "The dataset")',
        check.input_path,
        shown="required",
        group="run",
    ),
    Flag(
        "batch_size",
        None,
        "samples per batch file",
        optional(integer(1, 10**9)),
        shown_default="required",
        kind=int,
        group="run",
    ),
    text_flag(
        "run_name",
        None,
        "output goes to <output_dir>/<run_name>/",
        optional(check.run_name),
        shown="required",
        group="run",
    ),
    Flag(
        "resume",
        False,
        "continue the run: done and discarded samples are skipped, failed ones re-run",
        check.boolean,
        group="run",
    ),
    Flag("verbose", False, "log every sample; tracebacks on fatal errors", check.boolean, group="run"),
    Flag(
        "progress_seconds",
        10.0,
        "seconds between progress lines when stderr is not a terminal (a terminal gets a live line)",
        check.seconds,
        group="run",
    ),
    Flag(
        "max_samples",
        None,
        "only the first N valid dataset entries",
        optional(integer(1, 10**12)),
        shown_default="all",
        kind=int,
        group="run",
    ),
    Flag("log_prefix_chars", 100, "length of prompt previews in --verbose logs", integer(0, 1_000_000), group="run"),
    Flag("list_distributions", False, "print every distribution and exit", check.boolean, group="run"),
    Flag(
        "samples_per_prompt",
        1,
        "rollouts of each prompt, each in its own sandbox (`sample_index` 0..N-1); pass@k for k up to N",
        integer(1, 100_000),
        group="run",
    ),
    Flag(
        "rescore",
        False,
        "check every sample of the finished --run_name again against --dataset_file's checks as they are now, "
        "with no model call: `answer` against the recorded last message, `verify` and a Harbor task's tests in a "
        "fresh sandbox holding the sample's kept final state (see docs/replay.md)",
        check.boolean,
        group="run",
    ),
    Flag("seed", None, "reproducible toolset sampling, whatever the scheduling", _seed, kind=int, group="run"),
    text_flag("output_dir", "data", "parent of the run directory", group="run"),
    Flag(
        "plugins",
        None,
        "Python modules or .py files (comma-separated) whose tools, sandbox backends, dataset formats or models "
        "the run uses, besides installed plug-ins (see docs/plugins.md)",
        check.name_list,
        kind=str,
        group="run",
    ),
)
