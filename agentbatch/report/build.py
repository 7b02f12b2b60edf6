"""Write a report of one run, or of several side by side: each run's files read once, feeding its figures and the
trajectories' index and chunks, then the page written beside and swapped in whole."""

from __future__ import annotations

import math
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from agentbatch.errors import FatalError
from agentbatch.report import page, prompts
from agentbatch.report.figures import Figures
from agentbatch.report.pack import COLUMNS, KIND_CODES, STATUS_CODES, Index, compress_chunk
from agentbatch.run_dir import atomic
from agentbatch.run_dir.lock import export_lock
from agentbatch.run_dir.paths import RunPaths
from agentbatch.run_dir.reader import RunReader

# What the report shows of checkpoint.json: its texts, and its numbers (anything else, as a hand edit leaves, is null).
CHECKPOINT_TEXTS = ("state", "model", "distribution", "dataset_file", "updated_at")
CHECKPOINT_NUMBERS = ("total_prompts", "batch_size", "sessions", "duration_seconds")


@dataclass
class Written:
    """What a report holds and what writing it took."""

    path: Path
    items: int
    bytes: int
    seconds: float
    skipped: int


def write_report(run_dirs: list[Path], out: Path, secrets: tuple[str, ...] = ()) -> Written:
    """Write the report of these runs (the first is the run; more are shown beside it) to `out`."""
    start = time.monotonic()
    readers = [RunReader(d, secrets) for d in run_dirs]
    require_runs(run_dirs)
    names = _names([Path(d) for d in run_dirs])
    try:
        # One writer at a time: the exports' lock (a report is the run exported to a page; a second report or an
        # export waits for this one), then run_dir's atomic writer swaps the page in whole.
        with (
            export_lock(RunPaths(out.parent)),
            tempfile.TemporaryFile(dir=out.parent) as chunks,
            atomic.replacing(out) as f,
            _Chunks(chunks) as writer,
        ):
            index, runs = _read(readers, names, writer)
            data, blob = _contents(names, runs, index)
            page.write_page(f, data["title"], data, blob, chunks)
    except OSError as e:
        raise FatalError(f"cannot write the report {out}: {e.strerror or e}; the run's files are unchanged") from None
    skipped = sum(sum(c.skipped().values()) for r in readers for c in r.counts.values())
    return Written(out, len(index), out.stat().st_size, time.monotonic() - start, skipped)


def _read(readers: list[RunReader], names: list[str], writer: _Chunks) -> tuple[Index, list[dict]]:
    """Every line of every run, once: into its run's figures, the index, and the chunks."""
    index, runs = Index(), []
    for number, reader in enumerate(readers):
        figures = Figures(reader.tool_names)
        first = len(index)
        for line in reader.everything():
            figures.add(line, len(index))
            if body := index.add(number, line):
                writer.add(body)
        checkpoint = _checkpoint(reader.checkpoint())
        runs.append(
            {
                "name": names[number],
                "path": reader.dir,
                "items": [first, len(index)],
                "checkpoint": checkpoint,
                "artifacts": reader.artifacts(),
                **figures.to_dict(names[number], checkpoint, reader.counts),
            }
        )
    if index.has_pending():
        writer.add(index.flush())
    writer.finish()
    return index, runs


def _contents(names: list[str], runs: list[dict], index: Index) -> tuple[dict, dict]:
    """The page's figures (read at once) and its index (the list, filters and side by side read it)."""
    table = prompts.unify(index)
    data = {
        "title": _title(names),
        "generated_at": datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds"),
        "runs": runs,
        "items": len(index),
        "chunk_starts": index.chunk_starts,
        "kinds": list(KIND_CODES),
        "statuses": list(STATUS_CODES),
    }
    shape = None
    if len(runs) > 1:
        shape = prompts.side_by_side(index, len(runs), len(table["text"]))
        data["compare"] = prompts.dataset_note(names, [r["checkpoint"] for r in runs], shape)
    columns = {c: index.columns[c] for c in COLUMNS}
    return data, {"strings": index.strings.to_list(), "columns": columns, "prompts": table, "side_by_side": shape}


class _Chunks:
    """Chunks compressed on a second thread (zlib lets go of the GIL) while lines are read, written in order."""

    AHEAD = 4  # chunks compressing at once, at most: a few megabytes

    def __init__(self, out: BinaryIO):
        self.out, self.number = out, 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="report-gzip")
        self.pending: deque = deque()

    def add(self, body: bytes) -> None:
        self.pending.append(self.pool.submit(compress_chunk, body))
        while len(self.pending) > self.AHEAD:
            self._write_one()

    def finish(self) -> None:
        while self.pending:
            self._write_one()

    def __enter__(self) -> _Chunks:
        return self

    def __exit__(self, *exc) -> None:
        self.pool.shutdown(cancel_futures=True)

    def _write_one(self) -> None:
        self.out.write(page.chunk_element(self.number, self.pending.popleft().result()))
        self.number += 1


def require_runs(run_dirs: list[Path]) -> None:
    """Raise the one-line error of the first directory that holds no run."""
    for path in run_dirs:
        if not RunPaths(path).holds_run():
            raise FatalError(
                f"no run in {path}: it does not exist or holds no batch file, discards, failures or "
                "checkpoint (check --run_name and --output_dir)"
            )


def _checkpoint(doc: dict) -> dict:
    texts = {k: doc[k] if isinstance(doc.get(k), str) else None for k in CHECKPOINT_TEXTS}
    numbers = {k: doc.get(k) for k in CHECKPOINT_NUMBERS}
    for k, v in numbers.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            numbers[k] = None
    return texts | numbers


def _names(paths: list[Path]) -> list[str]:
    """Each run's name; two directories of one name are told apart by their parent's."""
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


def _title(names: list[str]) -> str:
    return f"Run {names[0]}" if len(names) == 1 else "Runs " + ", ".join(names) + " side by side"
