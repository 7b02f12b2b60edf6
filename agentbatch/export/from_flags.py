"""The export flags: an export of an existing run, or the exports written at the end of a session."""

from __future__ import annotations

import sys

from agentbatch.export.common import Filters
from agentbatch.export.run_export import export
from agentbatch.settings import OutputFlags, Settings


def filters(o: OutputFlags) -> Filters:
    return Filters(
        completed_only=o.export_completed_only,
        no_partial=o.export_no_partial,
        no_tool_errors=o.export_no_tool_errors,
        min_turns=o.export_min_turns,
        toolsets=o.export_toolsets,
        passed_only=o.export_passed_only,
    )


def export_only(s: Settings, secrets: tuple[str, ...]) -> int:
    """`--run_name=NAME --export=...` without a dataset: export that run as it is now (finished, running or killed).

    Lines were redacted when written; `secrets` (this environment's credentials) are taken out again."""
    from agentbatch.errors import FatalError

    if s.run.run_name is None:
        raise FatalError("--export needs --run_name: the run to export (data/<run_name>/)")
    export(s.run.run_dir, s.run.run_name, s.output.export, filters(s.output), secrets)
    return 0


def after_session(s: Settings, secrets: tuple[str, ...], code: int) -> int:
    """The exports asked for with a run, written once its session has ended (not after Ctrl-C or a write failure)."""
    if code not in (0, 3):
        print("export skipped: the session did not finish; export later with --run_name and --export", file=sys.stderr)
        return code
    export(s.run.run_dir, s.run.run_name, s.output.export, filters(s.output), secrets)
    return code
