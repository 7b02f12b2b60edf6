"""What is written from the run's files besides them: the exports, their filters, the report.

The `output` group of the settings (settings.OutputFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.export import check_formats
from agentbatch.flag_type import Flag, integer

FLAGS: tuple[Flag, ...] = (
    Flag(
        "export",
        None,
        "write the run in these formats to <output_dir>/<run_name>/export/<format>/: openai, llama_factory, hermes, "
        "atif, parquet, inspect, tokens (comma-separated); with --run_name alone it exports that run and exits, with "
        "--dataset_file at the end of every session",
        lambda n, v: check_formats(n, check.name_list(n, v)),
        kind=str,
        group="output",
    ),
    Flag(
        "export_completed_only",
        False,
        "export only trajectories the model ended by answering",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_no_partial",
        False,
        "leave partial trajectories (cut off, context full) out of the export",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_no_tool_errors",
        False,
        "leave trajectories with a failed tool call out of the export",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_min_turns",
        0,
        "leave trajectories with fewer assistant turns out of the export",
        integer(0, 1_000_000),
        group="output",
    ),
    Flag(
        "export_toolsets",
        None,
        "export only trajectories that were offered all these toolsets (comma-separated)",
        check.name_list,
        kind=str,
        group="output",
    ),
    Flag(
        "export_passed_only",
        False,
        "export only trajectories whose check passed (`passed: true`)",
        check.boolean,
        group="output",
    ),
    Flag(
        "report",
        False,
        "write the run's HTML report to <output_dir>/<run_name>/report.html (docs/report.md); with --run_name alone "
        "it writes it and exits, with --dataset_file at the end of every session",
        check.boolean,
        group="output",
    ),
    Flag(
        "compare",
        None,
        "runs to show beside --run_name's, side by side, in <output_dir>/<run_name>/compare.html: names under "
        "--output_dir or run directories (comma-separated); written when --report would be",
        check.name_list,
        text=True,
        group="output",
    ),
)
