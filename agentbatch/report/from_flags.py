"""The report flags: the report of an existing run (and runs beside it), or the one written at the end of a session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agentbatch.errors import FatalError
from agentbatch.report.build import Written, require_runs, write_report
from agentbatch.run_dir.paths import COMPARE, REPORT, named_run
from agentbatch.run_dir.reader import RunReader
from agentbatch.settings import Settings


def report_only(s: Settings, secrets: tuple[str, ...]) -> int:
    """`--run_name=NAME --report` (or `--compare=...`) without a dataset: write it as the run is now, and exit.

    Lines were redacted when written; `secrets` (this environment's credentials) are taken out again."""
    if s.run.run_name is None:
        raise FatalError("--report needs --run_name: the run to report on (data/<run_name>/)")
    write(s, secrets)
    return 0


def check(s: Settings) -> None:
    """Before anything is paid: every run --compare names holds a run (the run itself is written by its session)."""
    run = Path(s.run.run_dir) if s.run.run_name is not None else None
    others = _compared(s)
    require_runs([o for o in others if run is None or not _same(o, run)])


def _compared(s: Settings) -> list[Path]:
    """The runs --compare names: names under --output_dir, or run directories."""
    return [Path(named_run(s.run.output_dir, name)) for name in s.output.compare]


def _same(a: Path, b: Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def after_session(s: Settings, secrets: tuple[str, ...], code: int) -> int:
    """The report asked for with a run, written once its session has ended (not after Ctrl-C or a write failure)."""
    if code not in (0, 3, 4):
        print(
            "report skipped: the session did not finish; write it later with --run_name and --report", file=sys.stderr
        )
        return code
    write(s, secrets)
    return code


def write(s: Settings, secrets: tuple[str, ...]) -> list[Written]:
    run = Path(s.run.run_dir)
    others = _compared(s)
    require_runs([run, *others])  # before anything is written
    for path in (run, *others):
        for note in RunReader(path).notes():
            print(f"warning: {note}", file=sys.stderr)
    done = []
    if s.output.report:
        done.append(write_report([run], run / REPORT, secrets))
    if others:
        done.append(write_report([run, *others], run / COMPARE, secrets))
    for w in done:
        print(_summary(w), file=sys.stderr)
    return done


def _summary(w: Written) -> str:
    skipped = (
        f"; {w.skipped} lines skipped (torn or not records: see its Discards & failures view)" if w.skipped else ""
    )
    return f"report: {w.path} ({w.items} lines shown, {w.bytes / 1e6:.1f} MB, {w.seconds:.1f} s){skipped}"
