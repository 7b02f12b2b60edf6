"""The rollouts' one scheduler: every call's samples through one executor run, each group handed back once whole.

One thread (`Feed`) runs the executor for the life of the Rollouts: its tasks are the samples of every call
not yet handed out, asked for through `admit` (which says whether one can be had now; `wake` makes the
executor ask at once). Each call has a window of groups it may have started and not yet read: a caller who
stops reading holds its rollouts back, its finished groups never pile up past the window. Outcomes are
recorded in the run directory first (when there is one, rollout_run.py), then added to their group; a group
is handed to its call when all its samples have come back. A cancelled call's samples not started are
dropped and those in flight end at their next model call or tool (executor.cancel).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from agentbatch.budget import Budget
from agentbatch.executors.base import Executor
from agentbatch.work import SampleOutcome, SampleTask


@dataclass
class Sample:
    """One rollout of a task: its trajectory line (None when it failed), how it ended, and why if it failed."""

    sample: int  # its sample index in the group (the line's sample_index)
    status: str  # "done", "discarded" (a quality filter's) or "failed"
    record: dict | None = None  # the trajectory line, as in trajectories.jsonl (discard_reason on a discarded one)
    error: str | None = None

    @property
    def reward(self) -> float | None:
        """The check's reward (None: no check, or it failed before one)."""
        value = self.record.get("reward") if self.record else None
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def tokens(self) -> dict | None:
        """The tokens the model saw and sampled (the line's `tokens`, with --token_ids); None without."""
        return self.record.get("tokens") if self.record else None

    @property
    def policy_version(self) -> str | None:
        """The policy label its model calls used (the line's `policy_version`)."""
        return self.record.get("policy_version") if self.record else None


@dataclass
class Group:
    """A task's samples, handed back once all have finished, `index` its position in the call's tasks."""

    index: int
    task: Any  # the task as the call gave it
    samples: list[Sample] = field(default_factory=list)


class BudgetSpent(Exception):
    """The run's budget lets no further sample start: the calls still waiting for some end with it."""


END = object()  # what a call's consumer gets after its last group
CLOSE_GRACE_SECONDS = 10.0


class Call:
    """One `run` of tasks: its groups not started, how many are open (started, not yet read), its consumer."""

    def __init__(self, window: int, deliver: Callable[[object], None]):
        self.window = window
        self.deliver = deliver  # called with a Group, an exception, or END (from the feed's thread, or submit's)
        self.waiting: deque[list[SampleTask]] = deque()  # each group's samples still to run, not yet started
        self.open = 0
        self.in_flight = 0
        self.left = 0  # groups not yet handed back
        self.cancelled = False
        self.failed = 0  # samples that failed

    def finish(self, group: Group) -> None:
        group.samples.sort(key=lambda s: s.sample)
        self.failed += sum(s.status == "failed" for s in group.samples)
        self.left -= 1
        self.deliver(group)
        if self.left == 0:
            self.deliver(END)


Record = Callable[[SampleOutcome, SampleTask | None], dict | None]


class Feed:
    """The executor's run over every call's samples, on a thread of its own (module docstring)."""

    def __init__(self, executor: Executor, record: Record, budget: Budget | None = None):
        self.executor = executor
        self.record = record  # writes the outcome's line (a run directory's); the record to hand back
        self.budget = budget  # --budget_usd, --budget_tokens: whether another sample may start
        self._lock = threading.Lock()
        self._calls: list[Call] = []
        self._ready: deque[SampleTask] = deque()  # samples of started groups, to hand out
        self._groups: dict[int, tuple[Call, Group, int]] = {}  # a group's task number → its call, group, size
        self._handed: dict[tuple[int, int], SampleTask] = {}  # samples in flight
        self._numbers = itertools.count()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="br-rollouts", daemon=True)
        self._thread.start()

    def number(self) -> int:
        """The next group's task number: its samples' prompt_index, unique over the Rollouts' life."""
        return next(self._numbers)

    def submit(self, call: Call, groups: list[tuple[int, Group, int, list[SampleTask]]]) -> None:
        """Run the call's groups: (task number, group, its size, its samples still to run)."""
        call.left = len(groups)
        if not groups:
            call.deliver(END)
        for _, group, _, tasks in groups:
            if not tasks:  # every sample recorded before (a resumed run): open until read, as any
                call.open += 1
                call.finish(group)  # before the feed's thread sees the call: one thread finishes its groups
        with self._lock:
            if self.error is not None:
                raise RuntimeError(f"the rollouts stopped: {self.error}")
            for number, group, size, tasks in groups:
                if tasks:
                    self._groups[number] = (call, group, size)
                    call.waiting.append(tasks)
            if call.waiting:
                self._calls.append(call)
        self.executor.wake()

    def taken(self, call: Call) -> None:
        """The consumer read one of the call's groups: another may start."""
        with self._lock:
            call.open -= 1
        self.executor.wake()

    def cancel(self, call: Call) -> None:
        """The call's samples not started never will be; those in flight end soon (their outcomes are recorded)."""
        with self._lock:
            call.cancelled = True
            call.waiting.clear()
            keys = [key for key, t in self._handed.items() if self._groups[t.index][0] is call]
            if call.in_flight == 0:
                self._drop(call)
        self.executor.cancel(keys)
        self.executor.wake()

    def close(self) -> None:
        """Stop: nothing more is handed out, what runs is cancelled, the executor's run returns and its workers end
        (each removes its last samples' sandboxes first, closing.py: a reap after this finds only what they left)."""
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            self.cancel(call)
        self._stop.set()
        self.executor.wake()
        # A cancelled sample ends at its next model call or tool: one waiting on a slow reply is not awaited.
        self._thread.join(timeout=CLOSE_GRACE_SECONDS)
        if self._thread.is_alive():
            self.executor.kill()  # as a second Ctrl-C: the workers still holding samples die, sandboxes reaped
            self._thread.join()
        self.executor.close()

    def _drop(self, call: Call) -> None:
        self._calls = [c for c in self._calls if c is not call]
        for number in [n for n, (c, _, _) in self._groups.items() if c is call]:
            del self._groups[number]

    def _loop(self) -> None:
        try:
            for outcome in self.executor.run(self._tasks(), self._stop, self._admit):
                self._arrived(outcome)
        except BaseException as e:  # a write failed, the workers broke: every call hears it
            with self._lock:
                self.error = e
                calls, self._calls = list(self._calls), []
            for call in calls:
                call.deliver(e)

    def _tasks(self) -> Iterator[SampleTask]:
        while True:
            with self._lock:
                task = self._ready.popleft()  # _admit, just before in this thread, said there is one
                self._handed[task.key] = task
            yield task

    def _admit(self) -> bool:
        """Whether a sample can be handed out now: one of a started group, else the first of a call's next group."""
        with self._lock:
            while self._ready and self._cancelled(self._ready[0]):
                self._ready.popleft()
            if not self._within_budget():
                return False
            if self._ready:
                return True
            for call in self._calls:  # the oldest call first: its groups are awaited longest
                if call.waiting and call.open < call.window and not call.cancelled:
                    tasks = call.waiting.popleft()
                    call.open += 1
                    call.in_flight += len(tasks)
                    self._ready.extend(tasks)
                    return True
            return False

    def _within_budget(self) -> bool:
        """Whether the budget lets one more sample start; once none runs and none may, every call waiting ends."""
        if self.budget is None or self.budget.may_start(len(self._handed)):
            return True
        if not self._handed:
            self.budget.stopped = True
            spent = BudgetSpent(f"budget reached ({self.budget.describe()})")
            for call in [
                c for c in self._calls if c.waiting or any(self._groups[t.index][0] is c for t in self._ready)
            ]:
                call.cancelled = True
                call.deliver(spent)
                self._drop(call)
            self._ready.clear()
        return False

    def _cancelled(self, task: SampleTask) -> bool:
        found = self._groups.get(task.index)
        return found is None or found[0].cancelled

    def _arrived(self, outcome: SampleOutcome) -> None:
        with self._lock:
            task = self._handed.pop(outcome.key, None)
        record = self.record(outcome, task)
        with self._lock:
            call, group, size = self._groups[outcome.index]
            call.in_flight -= 1
            group.samples.append(Sample(outcome.sample_index, outcome.status, record, outcome.error))
            whole = len(group.samples) == size and not call.cancelled
            if whole:
                del self._groups[outcome.index]
            if call.cancelled and call.in_flight == 0 or (whole and call.left == 1):
                self._drop(call)
        if whole:
            call.finish(group)
