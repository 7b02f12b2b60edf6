"""What a session writes as its samples finish: one line per outcome, and checkpoint.json.

Each outcome goes to its file the moment it arrives, flushed: a done sample to its batch file, a discarded
one to discarded.jsonl (the whole record and why), a failed attempt to failed.jsonl. checkpoint.json is
replaced when an outcome arrives at least CHECKPOINT_SECONDS after the last one, after syncing the files.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentbatch.run_dir import artifacts
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.paths import CHECKPOINT, DISCARDED, FAILED, final_state_name
from agentbatch.run_dir.reader import read_json
from agentbatch.work import now_iso
from trajectory import no_task, with_tool_names

if TYPE_CHECKING:
    from agentbatch.work import SampleOutcome, SampleTask

CHECKPOINT_SECONDS = 2.0


@dataclass(frozen=True)
class RunFacts:
    """What checkpoint.json says of the run besides its progress."""

    run_name: str
    model: str
    dataset_file: str
    distribution: str
    batch_size: int
    total_prompts: int


class Recorder:
    """Writes each outcome and the checkpoint; `on_trajectory` gets every trajectory the merge need not read back."""

    def __init__(self, files: RunFiles, facts: RunFacts, on_trajectory: Callable[[dict], None]):
        self.files, self.facts, self.on_trajectory = files, facts, on_trajectory
        self.counts: Counter = Counter()  # this session's outcomes by status
        self.previous: dict = {}  # the checkpoint of the session before
        self.started = time.monotonic()
        self._last_checkpoint = 0.0

    def start(self) -> None:
        """Ready the directory for appends, and read what the session before said (raises OSError)."""
        self.files.prepare()
        self.previous = read_json(self.files.paths.path(CHECKPOINT)) or {}

    def record(self, o: SampleOutcome, task: SampleTask | None) -> None:
        """Write the outcome's line, and the checkpoint when it is due (raises OSError)."""
        files = self.files
        # An entry for each of the run's tools: after a resume with other tools, its own and the earlier ones'.
        record = with_tool_names(o.record, files.tool_names) if o.record is not None else None
        if o.final_state is not None:
            record = self._keep_state(o, record)
        if o.files:  # before its line: a line's files are there once the line is
            artifacts.write(files.paths, o.index, o.sample_index, o.files, files.redact)
        if o.status == "done":
            if files.append(files.paths.batch(o.batch_num), record, kept=True):
                self.on_trajectory(record)
        elif o.status == "discarded":
            files.append(files.paths.path(DISCARDED), dict(record, discard_reason=o.error))
        else:
            files.append(
                files.paths.path(FAILED),
                {
                    "prompt_index": o.index,
                    "sample_index": o.sample_index,
                    "identity": task.identity if task else "",
                    "prompt": o.prompt,
                    "error": o.error,
                    "timestamp": now_iso(),
                    "batch_num": o.batch_num,
                    "usage": o.usage,
                    "stop_reason": "error",
                    "model": self.facts.model,
                    "toolsets_used": list(task.toolsets) if task else [],
                    "task": (task.metadata if task else None) or no_task(),
                },
            )
        self.counts[o.status] += 1
        if time.monotonic() - self._last_checkpoint >= CHECKPOINT_SECONDS:
            self.checkpoint("running")

    def _keep_state(self, o: SampleOutcome, record: dict | None) -> dict | None:
        """The sample's kept final state recorded before its line, which names it; a failed attempt's removed."""
        if record is None or o.status not in ("done", "discarded"):
            if isinstance(o.final_state, str):
                with contextlib.suppress(OSError):
                    os.unlink(o.final_state)
            return record
        name = final_state_name(o.index, o.sample_index)
        self.files.keep_state(o.final_state, name)
        return dict(record, final_state=name)

    def checkpoint(self, state: str) -> None:
        """Sync the lines written so far, then say so in checkpoint.json (raises OSError)."""
        self.files.sync()
        batches = self.files.paths.batch_numbers()
        f = self.facts
        self.files.write_json(
            CHECKPOINT,
            {
                "run_name": f.run_name,
                "state": state,
                "dataset_file": f.dataset_file,
                "distribution": f.distribution,
                "model": f.model,
                "batch_size": f.batch_size,
                "total_prompts": f.total_prompts,
                "this_session": dict(self.counts),
                "batches": batches,
                "last_batch": batches[-1] if batches else None,
                "sessions": int(_number(self.previous.get("sessions"))) + (1 if state != "running" else 0),
                "duration_seconds": round(self.duration(), 3),
                "updated_at": now_iso(),
            },
        )
        self._last_checkpoint = time.monotonic()

    def duration(self) -> float:
        """Seconds of every session of the run so far, this one included."""
        return _number(self.previous.get("duration_seconds")) + (time.monotonic() - self.started)

    @property
    def recorded(self) -> int:
        return sum(self.counts.values())


def _number(value: object) -> float:
    """A count from an earlier checkpoint; anything but a finite non-negative number (a hand edit) is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return 0.0
    return float(value)
