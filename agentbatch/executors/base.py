"""What the session asks of an executor, and the slot bookkeeping the process and Ray executors share.

An executor runs prompts somewhere (worker processes here, actors of a Ray cluster) with a fixed number
of slots, hands a prompt to a worker as soon as one of its slots is free (a slow prompt holds up only its
own slot), and yields each outcome as it arrives. Workers only compute and return; the session writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from agentbatch.prompt_runner import PromptOutcome, PromptTask


class Executor(Protocol):
    def run(self, tasks: Iterable[PromptTask], stop: threading.Event) -> Iterator[PromptOutcome]:
        """Yield outcomes as prompts finish; after `stop` is set no new prompt is handed out."""

    def close(self) -> None:
        """Stop at once (a second Ctrl-C, a write failure): workers holding prompts are killed, not awaited."""


class Slots:
    """Which prompts each of `workers` workers holds, at most `per_worker` each."""

    def __init__(self, workers: int, per_worker: int):
        self.per_worker = per_worker
        self.held: list[dict[tuple[int, int], PromptTask]] = [{} for _ in range(workers)]

    def fill(self, pending: Iterator[PromptTask], send: Callable[[int, PromptTask], None]) -> bool:
        """Hand tasks to the least-loaded workers until every slot is taken; True once `pending` is exhausted."""
        while True:
            worker = min(range(len(self.held)), key=lambda w: len(self.held[w]))
            if len(self.held[worker]) >= self.per_worker:
                return False
            task = next(pending, None)
            if task is None:
                return True
            self.held[worker][task.key] = task
            send(worker, task)

    def release(self, key: tuple[int, int]) -> None:
        """A sample's outcome arrived (key: its prompt and sample index): its slot is free."""
        for held in self.held:
            if held.pop(key, None) is not None:
                return

    def take(self, worker: int) -> list[PromptTask]:
        """The prompts a dead worker held (its slots are free again)."""
        lost = list(self.held[worker].values())
        self.held[worker].clear()
        return lost

    @property
    def busy(self) -> bool:
        return any(self.held)


def lost(task: PromptTask, error: str) -> PromptOutcome:
    """The outcome of a prompt whose worker died with it."""
    return PromptOutcome(task.index, task.prompt, task.batch_num, "failed", error=error, sample_index=task.sample_index)


def threads_per_worker(concurrency: int | None, num_workers: int) -> int:
    """Slots per worker for a total concurrency (at least one)."""
    if not concurrency:
        return 1
    return max(1, -(-concurrency // num_workers))
