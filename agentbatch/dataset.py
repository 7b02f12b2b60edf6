"""A dataset's row as every dataset format gives it (Entry), what identifies its task, and the error of a
dataset that cannot be used (docs/datasets.md). The formats themselves: dataset_formats.py."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from agentbatch.errors import FatalError
from agentbatch.limits import TaskLimits
from agentbatch.sandboxes.base import ImageBuild, Resources
from agentbatch.task_hooks import TaskHooks


@dataclass
class Entry:
    """One valid dataset row; its `identity` is task_identity of its task unless the row's format gives one."""

    line: int
    prompt: str
    image: str | None = None
    cwd: str | None = None
    setup: str | None = None
    verify: str | None = None
    answers: tuple[str, ...] = ()
    identity: str = ""  # what resume matches: task_identity of the row, unless its format gives one
    metadata: dict | None = None  # the task's name, difficulty, category and tags: the lines' `task`
    # What a format may give beyond the row (docs/datasets.md, "What a format gives its entries"):
    build: ImageBuild | None = None  # an image built before any sample; `image` becomes its tag then
    resources: Resources | None = None  # the sandbox's own CPUs, memory, disk, network, variables
    limits: TaskLimits = TaskLimits()  # its own time limits, bounded by the run's flags (frozen: shared)
    hooks: TaskHooks | None = None  # before the agent, and the check (task_hooks.py); pickled to the worker
    unavailable: str | None = None  # why its samples cannot run (its image did not build): they fail at once

    def __post_init__(self) -> None:
        if not self.identity:
            self.identity = task_identity(
                self.prompt, self.image, self.cwd, self.setup, self.verify, list(self.answers)
            )


def task_identity(*task: object) -> str:
    """What tells a row's task from every other (README, "Resume"): a hash of all of it, prompt, image, cwd,
    setup, verify and answers (and a format's own parts, such as a task directory's files, given after them).
    Rows alike in all of it are the same task; a row's finished lines carry it, and resume matches on it."""
    text = json.dumps(task, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class DatasetError(FatalError):
    """The dataset cannot be used at all: missing, unreadable, or no valid entry (one line, exit 2)."""
