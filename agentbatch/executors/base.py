"""What the session asks of an executor, and the slot bookkeeping the process and Ray executors share.

An executor runs samples somewhere (worker processes here, actors of a Ray cluster) with a fixed number
of slots, hands a sample to a worker as soon as one of its slots is free (a slow sample holds up only its
own slot), and yields each outcome as it arrives. Workers only compute and return; the session writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from agentbatch.work import SampleOutcome, SampleTask

# How long a finished worker (a process, a Ray actor) may take to end before it is killed: it removes its last
# samples' sandboxes first (sandboxes/closing.py), which for large directories takes seconds.
END_SECONDS = 60

# Asked before each sample is handed out (the run's budget): False keeps the slot empty for now.
Admit = Callable[[], bool]


class Executor(Protocol):
    def run(
        self, tasks: Iterable[SampleTask], stop: threading.Event, admit: Admit | None = None
    ) -> Iterator[SampleOutcome]:
        """Yield outcomes as samples finish; after `stop` is set, or while `admit()` is False, none is handed out."""

    def wake(self) -> None:
        """Tasks may be had, or admitted, now: a running `run` asks for them without waiting for its next poll."""

    def cancel(self, keys: Iterable[tuple[int, int]]) -> None:
        """End the samples of these keys in flight at their next model call or tool; their outcomes still come."""

    def kill(self) -> None:
        """From another thread than run's: the workers holding samples die now, their samples failed."""

    def close(self) -> None:
        """Stop at once (a second Ctrl-C, a write failure): workers holding samples are killed, not awaited."""


class Slots:
    """Which samples each of `workers` workers holds, at most `per_worker` each."""

    def __init__(self, workers: int, per_worker: int, total: int | None = None):
        self.per_worker = per_worker
        self.total = total or workers * per_worker  # workers × per_worker may round the slots asked for up
        self.held: list[dict[tuple[int, int], SampleTask]] = [{} for _ in range(workers)]
        self.count = 0

    def fill(
        self, pending: Iterator[SampleTask], send: Callable[[int, SampleTask], None], admit: Admit | None = None
    ) -> bool:
        """Hand tasks to the least-loaded workers until every slot is taken; True once `pending` is exhausted."""
        while self.count < self.total:
            worker = min(range(len(self.held)), key=lambda w: len(self.held[w]))
            if len(self.held[worker]) >= self.per_worker or (admit is not None and not admit()):
                return False
            task = next(pending, None)
            if task is None:
                return True
            self.held[worker][task.key] = task
            self.count += 1
            send(worker, task)
        return False

    def release(self, key: tuple[int, int]) -> None:
        """A sample's outcome arrived (key: its prompt and sample index): its slot is free."""
        for held in self.held:
            if held.pop(key, None) is not None:
                self.count -= 1
                return

    def take(self, worker: int) -> list[SampleTask]:
        """The samples a dead worker held (its slots are free again)."""
        lost = list(self.held[worker].values())
        self.held[worker].clear()
        self.count -= len(lost)
        return lost

    @property
    def busy(self) -> bool:
        return self.count > 0


def lost(task: SampleTask, error: str) -> SampleOutcome:
    """The outcome of a sample whose worker died with it."""
    return SampleOutcome(task.index, task.prompt, task.batch_num, "failed", error=error, sample_index=task.sample_index)
