"""A Python caller's tasks as the runner's entries: dataset rows (dicts), task directories, or a format's entries.

A dict is a dataset row, checked as a JSONL line is (dataset_jsonl.entry_of); a path names what a dataset
format claims (a Harbor task directory) and must hold exactly one task; an `Entry` is taken as it is. Then the
same steps before any sample as a CLI run's, per format: its own `prepare`, each entry's limits bounded by the
flags, every image made ready (dataset_steps.prepare).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import agentbatch.dataset_formats as dataset_formats
import agentbatch.dataset_jsonl as dataset_jsonl
import agentbatch.dataset_steps as dataset_steps
from agentbatch.dataset import DatasetError, Entry
from agentbatch.dataset_formats import DatasetFormat
from agentbatch.errors import FatalError
from agentbatch.runtime import Runtime


class TaskError(FatalError):
    """A task of a call is not one the runner can run: the call runs none of them (one line)."""


def entries_of(tasks: Iterable[object]) -> list[tuple[DatasetFormat, Entry]]:
    """Each task's format and entry, in order; TaskError naming the first bad one (its position)."""
    out: list[tuple[DatasetFormat, Entry]] = []
    jsonl = dataset_formats.formats()["jsonl"]
    for i, task in enumerate(tasks):
        if isinstance(task, Entry):
            out.append((jsonl, replace(task)))  # a copy: the steps below complete it in place
        elif isinstance(task, dict):
            entry, why = dataset_jsonl.entry_of(task, i + 1)
            if entry is None:
                raise TaskError(f"task {i}: {why}")
            out.append((jsonl, entry))
        elif isinstance(task, str | os.PathLike):
            out.append(_from_path(i, os.fspath(task)))
        else:
            raise TaskError(
                f'task {i}: a {type(task).__name__}; a task is a row (a dict with a "prompt"), a task directory or an Entry'
            )
    return out


def _from_path(i: int, path: str) -> tuple[DatasetFormat, Entry]:
    if not os.path.isdir(path):
        raise TaskError(f'task {i}: {path!r} is no task directory (a row is a dict with a "prompt")')
    fmt = dataset_formats.format_of(path)
    try:
        entries, warnings = fmt.load(path, None)
    except DatasetError as e:
        raise TaskError(f"task {i}: {e}") from None
    if len(entries) != 1:
        why = f"; {warnings[0]}" if warnings else ""
        raise TaskError(f"task {i}: {path} holds {len(entries)} runnable tasks, not one{why}")
    return fmt, entries[0]


def prepare(pairs: list[tuple[DatasetFormat, Entry]], runtime: Runtime) -> list[Entry]:
    """The steps before any sample, for each format's entries together; the entries, in order."""
    s = runtime.settings
    context = dataset_steps.RunContext(runtime.run_dir if s.run.run_name else "", runtime.model)
    parallel = s.scale.sandbox_starts or os.cpu_count() or 1
    by_format: dict[str, tuple[DatasetFormat, list[Entry]]] = {}
    for fmt, entry in pairs:
        by_format.setdefault(fmt.name, (fmt, []))[1].append(entry)
    for fmt, entries in by_format.values():
        dataset_steps.refuse_other_formats(runtime.model, fmt)
        dataset_steps.prepare(fmt, entries, context, s.timeout_bounds(), runtime.cfg, parallel)
    return [entry for _, entry in pairs]
