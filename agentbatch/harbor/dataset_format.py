"""The `harbor` dataset format: `--dataset_file` naming a Harbor task directory or a directory of them.

It plugs in as any format does (docs/plugins.md shows it as the example). Each task is one entry: its
instruction is the prompt, its workdir the sample's working directory, and beyond the row's fields: its
image's build (environment/, built by the docker backend before any sample) or its docker_image, its
container's resources, its own limits, and its hooks (sample.py: before the agent, and the tests as the
check). Its identity (name and a hash of its files) is what resume matches, and its metadata (name,
difficulty, category, tags) goes into every line it makes. In the runner (run.py): the task.toml warnings
and refusals before any sample, the verifiers' images and the tasks' MCP tools once the images are made, the
oracle's verdict at the session's end.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from agentbatch.dataset import Entry
from agentbatch.dataset_formats import DatasetError, dataset_format
from agentbatch.dataset_steps import RunContext
from agentbatch.harbor.names import FORMAT

if TYPE_CHECKING:
    from agentbatch.harbor.task_dir import HarborTask

# The task readers and the runner's steps are imported when a run has Harbor tasks, not at every start, where
# every run registers this format (~20 ms of CPU: task.toml's fields, tomllib, Compose; bench (9)).


@dataset_format(FORMAT)
class HarborFormat:
    """Harbor task directories (docs/harbor.md)."""

    sandbox_note = "sandbox: docker (each Harbor task in a container of its own image, with its own resources)"

    def claims(self, path: str) -> bool:
        """A directory is a Harbor task set (a JSONL dataset is a file)."""
        return os.path.isdir(path)

    def load(self, path: str, max_samples: int | None) -> tuple[list[Entry], list[str]]:
        from agentbatch.harbor.task_set import TaskSetError, load_tasks

        try:
            tasks, warnings = load_tasks(path, max_samples)
        except TaskSetError as e:
            raise DatasetError(str(e)) from None
        return [entry(n, t) for n, t in enumerate(tasks, start=1)], warnings

    def prepare(self, entries: list[Entry], context: RunContext) -> None:
        from agentbatch.harbor import run

        run.prepare(entries, context)

    def ready(self, entries: list[Entry], context: RunContext) -> dict[str, tuple[tuple[str, ...], str]]:
        from agentbatch.harbor import run

        return run.ready(entries, context)

    def at_end(self, entries: list[Entry], context: RunContext) -> list[str]:
        from agentbatch.harbor import run

        return run.at_end(entries, context)


def entry(line: int, task: HarborTask) -> Entry:
    """One task as a dataset entry."""
    from agentbatch.harbor import sample

    return Entry(
        line=line,
        prompt=task.instruction,
        image=None if task.builds else task.image,
        cwd=task.config.workdir,
        identity=task.identity,
        metadata=task.metadata,
        build=task.image_build if task.builds else None,
        resources=sample.resources(task),
        limits=sample.limits(task),
        hooks=sample.HarborHooks(task),
    )
