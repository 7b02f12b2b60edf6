"""Rollouts on demand for a training loop (docs/rollouts.md): `from agentbatch import Rollouts`.

    with Rollouts(model="policy", base_url="http://127.0.0.1:8000/v1", samples_per_prompt=4) as rollouts:
        for group in rollouts.run([{"prompt": "..."}, ...]):   # a group per task, as soon as it is whole
            rewards = [s.reward for s in group.samples]
        rollouts.update(policy_version="step-2")                # the next samples' calls use the new label

`Rollouts(**flags)` takes the CLI's flags as keyword arguments (settings.build); entering it starts what a
run starts once (runtime.Runtime: sandboxes, the embedded model, MCP servers, the workers), leaving it stops
them all. With `run_name` every sample is recorded in data/<run_name>/ as a CLI run records it
(rollout_run.py); without, nothing is written. The scheduling of every call's samples is rollout_feed.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import agentbatch.flags as flags
import agentbatch.rollout_tasks as rollout_tasks
import agentbatch.settings as settings
from agentbatch.budget import Budget, BudgetSettings
from agentbatch.errors import FatalError
from agentbatch.model.client import ModelSettings
from agentbatch.rollout_feed import END, Call, Feed, Group, Sample
from agentbatch.rollout_run import RunRecords
from agentbatch.run_dir.spend import Spend
from agentbatch.runtime import Runtime
from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import RUN_DIR_LABEL
from agentbatch.secrets_guard import Redactor
from agentbatch.session import sample_task
from agentbatch.settings import Settings
from agentbatch.work import SampleOutcome, SampleTask
from toolset_distributions import prompt_rng, sample_toolsets

__all__ = ["Group", "Rollouts", "RolloutsError", "Sample"]

# What a call or `update` may point the workers at, without restarting them: flag → ModelSettings field.
MODEL_CHANGES = {"model": "model", "base_url": "base_url", "policy_version": "policy_version"}


class RolloutsError(RuntimeError):
    """The rollouts cannot go on (a run directory's write failed, the workers broke); what was recorded stays."""


class Groups:
    """A call's groups as they finish: iterate it, or `next_within(seconds)`; `close()` cancels what is left."""

    def __init__(self, feed: Feed):
        self.feed = feed
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self.call: Call | None = None

    def __iter__(self) -> Groups:
        return self

    def __next__(self) -> Group:
        group = self.next_within(None)
        assert group is not None
        return group

    def next_within(self, seconds: float | None) -> Group | None:
        """The next group to finish, None if none did within `seconds`; StopIteration after the last."""
        try:
            item = self.items.get(timeout=seconds)
        except queue.Empty:
            return None
        if item is END:
            raise StopIteration
        return _taken(self.call, item, self.feed)

    @property
    def failed(self) -> int:
        """Samples of this call that failed so far."""
        return self.call.failed if self.call else 0

    def close(self) -> None:
        """Cancel the samples not yet handed back: not started ones never start, running ones end soon."""
        if self.call is not None and self.call.left and not self.call.cancelled:
            self.feed.cancel(self.call)

    def __enter__(self) -> Groups:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _taken(call: Call | None, item: object, feed: Feed) -> Group:
    if isinstance(item, BaseException):
        raise RolloutsError(f"the rollouts stopped: {type(item).__name__}: {item}") from item
    feed.taken(call)
    return item  # type: ignore[return-value]


class Rollouts:
    """What a run starts once, kept open for many calls of `run` / `arun` (module docstring)."""

    def __init__(self, **values: Any):
        self.settings = settings.build(values)
        self._runtime: Runtime | None = None
        self._feed: Feed | None = None
        self._records: RunRecords | None = None
        self._model: ModelSettings | None = None
        self._redact = Redactor()
        self._budget: Budget | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Rollouts:
        runtime = self._runtime = Runtime(self.settings)
        runtime.__enter__()
        try:
            if self.settings.run.run_name is not None:
                self._records = RunRecords(runtime)
                self._records.open()
            executor = runtime.executor()  # its workers forked now, before the feed's thread
            self._model = runtime.cfg.model
            self._redact = Redactor(runtime.secrets)
            self._budget = self._records.session.budget if self._records is not None else fresh_budget(self.settings)
            self._feed = Feed(executor, self._record, self._budget)
        except BaseException:
            self._close("stopped")
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._close("interrupted" if exc[0] is not None else "finished")

    def _close(self, state: str) -> None:
        try:
            if self._feed is not None:
                self._feed.close()
            if self._records is not None:
                self._records.close(state)  # its session's end reaps what the run's workers left
            elif self._runtime is not None and hasattr(self._runtime, "cfg"):
                reap(self._runtime)
        finally:
            self._feed = self._records = None
            if self._runtime is not None:
                self._runtime.__exit__(None, None, None)
                self._runtime = None

    @property
    def policy_version(self) -> str | None:
        """The policy label the next samples' model calls are recorded with."""
        return self._require_open()[1].policy_version

    def update(self, **changes: Any) -> None:
        """Point the next samples at another `model`, `base_url` or `policy_version`, workers and sandboxes kept."""
        self._model = self._model_with(changes)

    def run(self, tasks: Iterable[Any], samples_per_prompt: int | None = None, **changes: Any) -> Groups:
        """A group per task as soon as all its samples finished (finishing order; `index`: its position). Changes of
        `model`, `base_url`, `policy_version` apply to this call only. The tasks are checked now (FatalError naming
        the first bad one); stopping early (`close`, or leaving a for loop over it) cancels the rest."""
        groups = Groups(self._require_open()[0])
        groups.call = self._start(tasks, samples_per_prompt, changes, groups.items.put)
        return groups

    async def arun(
        self, tasks: Iterable[Any], samples_per_prompt: int | None = None, **changes: Any
    ) -> AsyncIterator[Group]:
        """`run` for an asyncio caller: the same groups, awaited; the tasks are prepared off the event loop."""
        loop = asyncio.get_running_loop()
        items: asyncio.Queue = asyncio.Queue()

        def deliver(item: object) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody reads this call any more
                pass

        call = await asyncio.to_thread(self._start, list(tasks), samples_per_prompt, changes, deliver)
        feed = self._require_open()[0]
        try:
            while (item := await items.get()) is not END:
                yield _taken(call, item, feed)
        finally:
            if call.left:
                feed.cancel(call)

    def _start(self, tasks: Iterable[Any], samples: int | None, changes: dict, deliver: Callable) -> Call:
        """The call's tasks checked and prepared, its samples submitted (those a resumed run has taken from it)."""
        feed, model = self._require_open()
        runtime = self._runtime
        n = self.settings.run.samples_per_prompt if samples is None else _samples(samples)
        model = self._model_with(changes) if changes else model
        tasks = list(tasks)
        entries = rollout_tasks.prepare(rollout_tasks.entries_of(tasks), runtime)
        window = max(2, -(-2 * runtime.plan.slots // n))  # groups open at once: every slot kept busy, no more
        with self._lock:  # calls from several threads (the server's requests) number their tasks in turn
            groups = self._groups(tasks, entries, n, model)
        call = Call(window, deliver)
        feed.submit(call, groups)
        return call

    def _groups(self, tasks: list, entries: list, n: int, model: ModelSettings) -> list:
        """Each task's group: its number, its samples recorded before (a resumed run) and those to run."""
        feed, runtime = self._require_open()[0], self._runtime
        if self._records is not None:
            self._records.given(entries)
        groups = []
        for i, (task, entry) in enumerate(zip(tasks, entries, strict=True)):
            number = feed.number()
            group, to_run = Group(i, task), []
            toolsets = sample_toolsets(runtime.distribution, prompt_rng(self.settings.run.seed, number))
            for s in range(n):
                earlier = self._records.earlier(entry, s, model.policy_version) if self._records else None
                if earlier is not None:
                    group.samples.append(Sample(s, earlier[0], self._handed_back(earlier[1])))
                    continue
                batch = self._records.next_batch() if self._records else 0
                to_run.append(dataclasses.replace(sample_task(entry, number, s, batch, toolsets), model=model))
            groups.append((number, group, n, to_run))
        return groups

    def _model_with(self, changes: dict) -> ModelSettings:
        """The model settings with these changes, each checked by its flag; FatalError naming a bad one."""
        model = self._require_open()[1]
        unknown = sorted(set(changes) - set(MODEL_CHANGES))
        if unknown:
            raise FatalError(f"{unknown[0]}: only {', '.join(MODEL_CHANGES)} can change between calls")
        checked = {MODEL_CHANGES[k]: flags.BY_NAME[k].check(k, v) for k, v in changes.items()}
        if "model" in checked and not checked["model"]:
            raise FatalError("model must be a model's name")
        return dataclasses.replace(model, **checked)

    def _record(self, outcome: SampleOutcome, task: SampleTask | None) -> dict | None:
        """The feed's: the outcome's line written (a run directory's), the record handed back redacted as written."""
        if self._records is not None:
            self._records.record(outcome, task)  # its session counts the spend against the budget
        elif self._budget is not None:
            self._budget.add(outcome.usage)
        if outcome.record is None:
            return None
        record = outcome.record if outcome.status == "done" else dict(outcome.record, discard_reason=outcome.error)
        return self._handed_back(record)

    def _handed_back(self, record: dict) -> dict:
        if not self._redact:
            return record
        text = json.dumps(record, ensure_ascii=False)
        redacted = self._redact(text)
        return record if redacted == text else json.loads(redacted)

    def _require_open(self) -> tuple[Feed, ModelSettings]:
        if self._feed is None or self._model is None:
            raise RuntimeError("Rollouts is not open: use it as `with Rollouts(...) as rollouts:`")
        return self._feed, self._model


def fresh_budget(s: Settings) -> Budget | None:
    """The budget of rollouts without a run directory: nothing spent before them."""
    settings = BudgetSettings(
        s.budget.budget_usd, s.budget.budget_tokens, s.limits.max_cost_per_prompt, s.limits.max_tokens_per_prompt
    )
    return Budget(settings, Spend()) if settings.active else None


def reap(runtime: Runtime) -> None:
    """The sandboxes a killed worker left (a close that could not wait), when no session's end reaps them."""
    labels = {RUN_DIR_LABEL: runtime.cfg.sandbox_labels[RUN_DIR_LABEL]}
    for kind in runtime.cfg.sandbox.kinds(images=True):
        with contextlib.suppress(Exception):  # no engine: nothing of it to reap
            sandbox_backends.get(kind).reap(labels)


def _samples(value: Any) -> int:
    """A call's samples_per_prompt, checked as the flag is."""
    return flags.BY_NAME["samples_per_prompt"].check("samples_per_prompt", value)
