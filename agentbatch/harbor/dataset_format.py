"""The `harbor` dataset format: `--dataset_file` naming a Harbor task directory or a directory of them.

Each task is one entry: its instruction is the prompt, its image the one its environment/ builds (or its
docker_image), its workdir the sample's working directory; its identity (name and a hash of its files) is
what resume matches, and its metadata (name, difficulty, category, tags) goes into every line it makes.
"""

from __future__ import annotations

from agentbatch.dataset import Entry
from agentbatch.dataset_formats import DatasetError, dataset_format
from agentbatch.harbor.sample import HarborSample, Limits
from agentbatch.harbor.task_set import TaskSetError, claims, load_tasks


@dataset_format("harbor")
class HarborFormat:
    """Harbor task directories (docs/harbor.md)."""

    def claims(self, path: str) -> bool:
        return claims(path)

    def load(self, path: str, max_samples: int | None) -> tuple[list[Entry], list[str]]:
        try:
            tasks, warnings = load_tasks(path, max_samples)
        except TaskSetError as e:
            raise DatasetError(str(e)) from None
        entries = [
            Entry(
                line=n,
                prompt=t.instruction,
                image=t.image,
                cwd=t.config.workdir,
                identity=t.identity,
                metadata=t.metadata,
                harbor=HarborSample.of(t, Limits()),
            )
            for n, t in enumerate(tasks, start=1)
        ]
        return entries, warnings
