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

from agentbatch.dataset import Entry
from agentbatch.dataset_formats import DatasetError, dataset_format
from agentbatch.dataset_steps import RunContext
from agentbatch.harbor import run, sample
from agentbatch.harbor.task_dir import HarborTask
from agentbatch.harbor.task_set import FORMAT, TaskSetError, claims, load_tasks


@dataset_format(FORMAT)
class HarborFormat:
    """Harbor task directories (docs/harbor.md)."""

    sandbox_note = "sandbox: docker (each Harbor task in a container of its own image, with its own resources)"

    def claims(self, path: str) -> bool:
        return claims(path)

    def load(self, path: str, max_samples: int | None) -> tuple[list[Entry], list[str]]:
        try:
            tasks, warnings = load_tasks(path, max_samples)
        except TaskSetError as e:
            raise DatasetError(str(e)) from None
        return [entry(n, t) for n, t in enumerate(tasks, start=1)], warnings

    def prepare(self, entries: list[Entry], context: RunContext) -> None:
        run.prepare(entries, context)

    def ready(self, entries: list[Entry], context: RunContext) -> dict[str, tuple[tuple[str, ...], str]]:
        return run.ready(entries, context)

    def at_end(self, entries: list[Entry], context: RunContext) -> list[str]:
        return run.at_end(entries, context)


def entry(line: int, task: HarborTask) -> Entry:
    """One task as a dataset entry."""
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
