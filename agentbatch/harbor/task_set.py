"""A task set: `--dataset_file` naming one Harbor task directory or a directory of them (docs/harbor.md).

Every task that cannot run is skipped with a one-line reason (printable: a directory's name is the task set's
text, terminal_text.safe). The fields task.toml files carry that are ignored stay with their tasks: the run
reports them once per field and run (harbor/run.py).
"""

from __future__ import annotations

import os

from agentbatch.harbor.task_config import TaskError
from agentbatch.harbor.task_dir import HarborTask, is_task_dir, load
from agentbatch.terminal_text import safe


class TaskSetError(Exception):
    """The path holds no task at all."""


def task_dirs(path: str) -> list[str]:
    """The task directories under path: itself if it is one, else its subdirectories (hidden ones left out)."""
    if is_task_dir(path):
        return [path]
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        raise TaskSetError(f"cannot list {path}: {e.strerror}") from None
    return [os.path.join(path, n) for n in names if not n.startswith(".") and os.path.isdir(os.path.join(path, n))]


def load_tasks(path: str, max_samples: int | None = None) -> tuple[list[HarborTask], list[str]]:
    """The runnable tasks (the first max_samples of them, by directory name) and a warning per task skipped."""
    tasks: list[HarborTask] = []
    warnings: list[str] = []
    names: dict[str, str] = {}
    for task_path in task_dirs(path):
        if max_samples is not None and len(tasks) >= max_samples:
            break
        shown = os.path.relpath(task_path) if not os.path.isabs(path) else task_path
        try:
            task = load(task_path)
        except TaskError as e:
            warnings.append(safe(f"{shown}: skipped: {e}"))
            continue
        if task.name in names:
            warnings.append(safe(f"{shown}: skipped: task name {task.name!r} is also {names[task.name]}'s"))
            continue
        names[task.name] = shown
        tasks.append(task)
    if not tasks and not warnings:
        raise TaskSetError(
            f"{path} is a directory but holds no Harbor task (a directory with instruction.md and task.toml); "
            "--dataset_file names a JSONL file, a Harbor task directory or a directory of them"
        )
    return tasks, warnings
