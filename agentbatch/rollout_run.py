"""The run directory of a Python caller's rollouts: one session over the Rollouts' life, recording as the CLI does.

The session (session.py) holds the directory's lock from the Rollouts' start to its end, writes tools.json and
removes a dead session's sandboxes at its start, a line per outcome as it arrives (batch files, discarded.jsonl,
failed.jsonl, checkpoint.json), and trajectories.jsonl and statistics.json at its end: --resume, --export and
--report work on it as on a CLI run's. Its "dataset" is every task the calls gave, in order.

With --resume, the lines already there answer the samples they match before any is run: a line answers a
task's sample when it has the task's identity, the sample's index and the policy label in force
(`policy_version`, none for none), each line once. So a trainer that restarts a killed step with the same
tasks and label gets the samples that step recorded back, and runs only the others.
"""

from __future__ import annotations

import sys
from collections import defaultdict, deque
from contextlib import ExitStack

from agentbatch.budget import BudgetSettings
from agentbatch.dataset import Entry
from agentbatch.run_dir.answers import answer_key
from agentbatch.runtime import Runtime
from agentbatch.session import Session, SessionSettings
from agentbatch.work import SampleOutcome, SampleTask

# Samples per batch file when --batch_size is not given (the CLI requires it; a caller's rollouts need not).
DEFAULT_BATCH_SIZE = 100

EarlierKey = tuple[str | bytes, int, str | None]


class RunRecords:
    """The session over the run directory, and the lines a resumed run had (module docstring)."""

    def __init__(self, runtime: Runtime):
        s = runtime.settings
        self.session = Session(
            SessionSettings(
                runtime.cfg,
                runtime.run_dir,
                [],
                s.run.batch_size or DEFAULT_BATCH_SIZE,
                runtime.distribution,
                seed=s.run.seed,
                resume=s.run.resume,
                samples_per_prompt=s.run.samples_per_prompt,
                session_id=runtime.session_id,
                sandbox_note=runtime.sandbox_note,
                budget=BudgetSettings(
                    s.budget.budget_usd,
                    s.budget.budget_tokens,
                    s.limits.max_cost_per_prompt,
                    s.limits.max_tokens_per_prompt,
                ),
                slots=runtime.plan.slots,
                priced=runtime.priced,
            )
        )
        self._stack = ExitStack()
        self._earlier: dict[EarlierKey, deque[tuple[str, dict]]] = defaultdict(deque)
        self._handed = 0

    def open(self) -> None:
        """Take the directory (FatalError if another session holds it, or it holds a run and --resume is not given)."""
        self._stack.enter_context(self.session.lock())
        try:
            self.session.begin()
            if self.session.s.resume:
                self._read_earlier()
            found = sum(len(lines) for lines in self._earlier.values())
            again = f", {found} recorded lines to hand back" if found else ""
            print(f"rollouts recorded in {self.session.files.dir}{again}", file=sys.stderr)
        except BaseException:
            self._stack.close()
            raise

    def _read_earlier(self) -> None:
        reader = self.session.files.reader()
        for status, lines in (("done", reader.trajectories()), ("discarded", reader.discards())):
            for line in lines:
                key = answer_key(line.record)
                if key is not None:
                    version = line.record.get("policy_version")
                    self._earlier[(*key, version if isinstance(version, str) else None)].append((status, line.record))

    def earlier(self, entry: Entry, sample: int, policy_version: str | None) -> tuple[str, dict] | None:
        """A line already there answering this sample (used up), or None."""
        found = self._earlier.get((entry.identity, sample, policy_version))
        return found.popleft() if found else None

    def given(self, entries: list[Entry]) -> None:
        """A call's tasks join the run's (statistics.json counts them)."""
        self.session.s.entries.extend(entries)

    def next_batch(self) -> int:
        """The batch file of the next sample handed out."""
        batch = self.session.batch(self._handed)
        self._handed += 1
        return batch

    def record(self, outcome: SampleOutcome, task: SampleTask | None) -> None:
        """The outcome's line (raises OSError: the rollouts stop, every line written before intact)."""
        self.session.record(outcome, task)

    def close(self, state: str) -> dict | None:
        """The session's end (merge, statistics), the lock let go; the statistics, None if they could not be written."""
        try:
            return self.session.end(state)
        except OSError:
            return None
        finally:
            self._stack.close()
