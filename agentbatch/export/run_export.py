"""Export a run directory: read its files once, filter, feed every chosen format, swap each output in whole."""

from __future__ import annotations

import importlib
import json
import sys
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from agentbatch.errors import FatalError
from agentbatch.export import FORMATS
from agentbatch.export.common import ExportContext, Filters, RunSource, atomic_dir, write_json_atomic

REPORT = "report.json"


def export(
    run_dir: str | Path, run_name: str, formats: tuple[str, ...], filters: Filters, secrets: tuple[str, ...] = ()
) -> dict:
    """Write data/<run>/export/<format>/ for each format (replacing an earlier export) and export/report.json."""
    run_dir = Path(run_dir)
    source = RunSource(run_dir, secrets)
    if not source.exists():
        raise FatalError(f"nothing to export: {run_dir} holds no run (check --run_name and --output_dir)")
    ctx = ExportContext(
        run_name, run_dir, source.read_json("checkpoint.json"), source.read_json("statistics.json"), filters
    )
    export_dir = run_dir / "export"
    kept = 0
    try:
        with ExitStack() as stack:
            writers = {}
            for fmt in formats:
                tmp = stack.enter_context(atomic_dir(export_dir / fmt))
                module = importlib.import_module(f"agentbatch.export.{FORMATS[fmt][0]}")
                writers[fmt] = module.Writer(tmp, ctx)
            (only,) = writers.values() if len(writers) == 1 else (None,)
            if hasattr(only, "add_lines"):  # a format that reads the lines itself, faster than parsing each here
                kept = only.add_lines(source.line_blocks(only.BLOCK_BYTES), filters, source.counts)
            else:
                for record, raw in source.trajectories():
                    why = filters.rejects(record)
                    if why:
                        source.counts.filtered[why] += 1
                        continue
                    kept += 1
                    for w in writers.values():
                        w.add(record, raw)
            viewers = [w for w in writers.values() if getattr(w, "takes_all_outcomes", False)]
            if viewers:
                for line in source.discarded():
                    for w in viewers:
                        w.add_discarded(line)
                for line in source.unanswered_failures():
                    for w in viewers:
                        w.add_failed(line)
            results = {fmt: w.finish() for fmt, w in writers.items()}
    except OSError as e:
        raise FatalError(
            f"cannot write the export to {export_dir}: {e.strerror or e}; the run's files are unchanged"
        ) from None
    c = source.counts
    when = datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")
    report = _read_report(export_dir)
    for fmt, result in results.items():
        report[fmt] = {
            "exported_at": when,
            "path": str(export_dir / fmt),
            "filters": filters.describe(),
            "source": {
                "lines": c.lines,
                "bytes": c.bytes,
                "not_json": c.not_json,
                "unknown_tool": c.unknown_tool,
                "trajectories": c.trajectories,
            },
            "filtered": dict(c.filtered),
            "kept": kept,
            **result,
        }
    write_json_atomic(export_dir / REPORT, report)
    for fmt in formats:
        print(_summary(fmt, report[fmt]), file=sys.stderr)
    return report


def _read_report(export_dir: Path) -> dict:
    try:
        doc = json.loads((export_dir / REPORT).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _summary(fmt: str, r: dict) -> str:
    filtered = ", ".join(f"{n} {why}" for why, n in r["filtered"].items())
    skipped = ", ".join(f"{n} {why}" for why, n in (r.get("skipped") or {}).items())
    line = f"export {fmt}: {r['written']} written -> {r['path']} ({r['source']['trajectories']} trajectories"
    line += f"; filtered: {filtered}" if filtered else "; none filtered"
    if skipped:
        line += f"; not representable: {skipped}"
    return line + ")"
