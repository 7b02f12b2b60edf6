"""Export a run directory: read its files once, filter, feed every chosen format, swap each output in whole."""

from __future__ import annotations

import importlib
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from agentbatch.errors import FatalError
from agentbatch.export import FORMATS
from agentbatch.export.common import ExportContext, Filters, RunSource
from agentbatch.run_dir import atomic
from agentbatch.run_dir.lock import export_lock
from agentbatch.run_dir.paths import CHECKPOINT, EXPORT_REPORT, STATISTICS
from agentbatch.run_dir.reader import read_json
from agentbatch.work import now_iso


def export(
    run_dir: str | Path, run_name: str, formats: tuple[str, ...], filters: Filters, secrets: tuple[str, ...] = ()
) -> dict:
    """Write data/<run>/export/<format>/ for each format (replacing an earlier export) and export/report.json.

    One export of a run at a time: a second one waits for the first (run_dir/lock.py), so neither removes the
    other's folder in the making nor loses the other's entry of report.json.
    """
    source = RunSource(run_dir, secrets)
    if not source.exists():
        raise FatalError(f"nothing to export: {run_dir} holds no run (check --run_name and --output_dir)")
    for note in source.reader.notes():
        print(f"warning: {note}", file=sys.stderr)
    try:
        with export_lock(source.paths):
            report = _export(source, run_name, formats, filters)
    except OSError as e:
        raise FatalError(
            f"cannot write the export to {source.paths.export()}: {e.strerror or e}; the run's files are unchanged"
        ) from None
    for fmt in formats:
        print(_summary(fmt, report[fmt]), file=sys.stderr)
    return report


def _export(source: RunSource, run_name: str, formats: tuple[str, ...], filters: Filters) -> dict:
    """Read the records once, feed every format, swap each folder in, then record the export in report.json."""
    unknown = [ts for ts in filters.toolsets if ts not in source.tool_set.toolsets]
    if unknown:
        raise FatalError(
            f"--export_toolsets: this run has no toolset {unknown[0]!r}; its toolsets: "
            f"{', '.join(source.tool_set.toolsets)}"
        )
    ctx = ExportContext(
        run_name,
        source.dir,
        source.read_json(CHECKPOINT),
        source.read_json(STATISTICS),
        filters,
        source.tool_names,
    )
    export_dir = Path(source.paths.export())
    kept = 0
    with ExitStack() as stack:
        writers = {}
        for fmt in formats:
            tmp = stack.enter_context(atomic.replacing_dir(export_dir / fmt))
            module = importlib.import_module(f"agentbatch.export.{FORMATS[fmt][0]}")
            writers[fmt] = module.Writer(tmp, ctx)
        (only,) = writers.values() if len(writers) == 1 else (None,)
        if only is not None and only.reads_lines:  # it reads the lines itself, faster than parsing each here
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
        viewers = [w for w in writers.values() if w.takes_all_outcomes]
        if viewers:
            for line in source.discarded():
                for w in viewers:
                    w.add_discarded(line)
            for line in source.unanswered_failures():
                for w in viewers:
                    w.add_failed(line)
        results = {fmt: w.finish() for fmt, w in writers.items()}
    c = source.counts
    when = now_iso()
    report_path = export_dir / EXPORT_REPORT
    report = read_json(str(report_path)) or {}
    for fmt, result in results.items():
        report[fmt] = {
            "exported_at": when,
            "path": str(export_dir / fmt),
            "filters": filters.describe(),
            "source": {
                "lines": c.lines,
                "bytes": c.bytes,
                **c.skipped(),
                "trajectories": c.trajectories,
            },
            "filtered": dict(c.filtered),
            "kept": kept,
            **result,
        }
    atomic.write_text(report_path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


# How the summary names the lines the merge's rule leaves out (record_shape.why_skipped), as the merge's summary does.
LEFT_OUT = {"not_json": "not JSON", "malformed": "not trajectories", "unknown_tool": "calling unknown tools"}


def _summary(fmt: str, r: dict) -> str:
    source = r["source"]
    left_out = ", ".join(f"{source[why]} {words}" for why, words in LEFT_OUT.items() if source.get(why))
    filtered = ", ".join(f"{n} {why}" for why, n in r["filtered"].items())
    skipped = ", ".join(f"{n} {why}" for why, n in (r.get("skipped") or {}).items())
    line = f"export {fmt}: {r['written']} written -> {r['path']} ({source['trajectories']} trajectories"
    line += f"; lines skipped: {left_out}" if left_out else ""
    line += f"; filtered: {filtered}" if filtered else "; none filtered"
    if skipped:
        line += f"; not representable: {skipped}"
    return line + ")"
