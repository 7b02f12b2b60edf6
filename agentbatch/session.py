"""One session of a run: resume matching, scheduling, writing every file, merge and statistics."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

from agentbatch import sandboxes
from agentbatch.budget import Budget, BudgetSettings, spent_in
from agentbatch.dataset import Entry
from agentbatch.errors import FatalError
from agentbatch.executors.base import Executor
from agentbatch.outcome_stats import OutcomeStats
from agentbatch.progress import Progress
from agentbatch.prompt_runner import PromptOutcome, PromptTask, RunConfig, now_iso
from agentbatch.run_files import RunFiles, iter_records, prompt_key, sample_key
from agentbatch.run_statistics import RunStats, format_summary
from agentbatch.sandboxes.base import RUN_DIR_LABEL, owner_labels
from agentbatch.tools.registry import load_tools, unavailable_tools
from toolset_distributions import Distribution, prompt_rng, sample_toolsets

log = logging.getLogger("batch_runner")
CHECKPOINT_SECONDS = 2.0
EXIT_FAILURES = 3
EXIT_INTERRUPTED = 130
EXIT_WRITE_FAILED = 2
EXIT_BUDGET = 4


def new_session_id() -> str:
    """A session's id, unique on every machine and readable: start time, pid and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _WriteFailed(Exception):
    """Writing a file of the run directory failed (disk full, directory gone): not any other OSError."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class Session:
    """Runs the prompts not yet done and records each outcome as it arrives; the only writer of the run dir."""

    def __init__(
        self,
        cfg: RunConfig,
        files: RunFiles,
        entries: list[Entry],
        batch_size: int,
        dist: Distribution,
        seed: int | None,
        resume: bool,
        samples_per_prompt: int = 1,
    ):
        self.cfg, self.files, self.entries = cfg, files, entries
        self.batch_size, self.dist, self.seed, self.resume = batch_size, dist, seed, resume
        self.samples = samples_per_prompt
        self.counts = Counter()
        self.distribution = dist.name
        self.dataset_file = ""
        self.session_id = new_session_id()
        self.sandbox_note = ""
        self.started = time.monotonic()
        self.previous = {}
        self._last_checkpoint = 0.0
        # The merge's statistics: this session's trajectories are counted as they are written, so the merge
        # at the end copies their lines instead of reading each back (RunFiles.append).
        self._stats = RunStats()
        self._outcomes = OutcomeStats()
        self._kept: Counter = Counter()
        self.budget_settings = BudgetSettings()
        self.budget: Budget | None = None
        self.progress_seconds = 10.0
        self.slots = 1  # prompts the executor runs at once, for the ETA
        self.priced = False  # costs are known (prices given, or an endpoint that reports them)
        self.view: Progress | None = None
        self._tasks_started: dict[int, PromptTask] = {}
        self._stop: threading.Event | None = None

    def run(self, executor: Executor) -> int:
        """Run the session holding the run directory's lock: one session at a time, whatever else starts."""
        try:
            self.files.lock(self.session_id, now_iso())
        except OSError as e:
            raise FatalError(f"cannot write to {self.files.dir}: {e.strerror}") from None
        try:
            return self._run(executor)
        finally:
            self.files.unlock()

    def _run(self, executor: Executor) -> int:
        files = self.files
        if files.has_output() and not self.resume:
            raise FatalError(
                f"{files.dir} already holds a run; add --resume to continue it, or choose another --run_name"
            )
        try:
            files.prepare()
        except OSError as e:
            raise FatalError(f"cannot write to {files.dir}: {e.strerror}") from None
        self.previous = files.read_json("checkpoint.json") or {}
        kinds = {self.cfg.sandbox.kind} | ({"docker"} if any(e.image for e in self.entries) else set())
        self._reap(kinds)
        self._warn_unavailable_tools()
        remaining = self._remaining()
        first_batch = max(files.batch_numbers(), default=-1) + 1
        if self.sandbox_note:
            print(self.sandbox_note, file=sys.stderr)
        total = len(self.entries) * self.samples
        what = f"{len(self.entries)} prompts × {self.samples} samples" if self.samples > 1 else f"{total} prompts"
        print(f"{what}, {total - len(remaining)} already done, {len(remaining)} to run -> {files.dir}", file=sys.stderr)
        if self.budget_settings.active:
            self.budget = Budget(self.budget_settings, spent_in(files))
            if remaining and not self.budget.may_start(0):  # already spent: no workers to start
                self.budget.stopped, remaining = True, []
        stop = self._stop = threading.Event()
        interrupted = self._install_sigint(stop)
        bar = self.view = Progress(
            len(remaining), sys.stderr, self.progress_seconds, self.slots, self.budget, self.priced
        )
        quitting = False
        try:
            # Nothing left (a finished run resumed): no workers to spawn, only merge and statistics.
            admit = self._admit if self.budget is not None else None
            outcomes = executor.run(self._tasks(remaining, first_batch), stop, admit) if remaining else ()
            if remaining:
                bar.start()
            for outcome in outcomes:
                try:
                    self._record(outcome)
                    self._maybe_checkpoint()
                except OSError as e:
                    raise _WriteFailed(e) from e
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # quitting at once: a third Ctrl-C must not cut the clean-up
            quitting = True
            bar.close()
            executor.close()  # workers stop first, so none starts a container after the reap
            self._reap(kinds, "of the prompts stopped at once")
            self._checkpoint(state="interrupted")
            files.close()
            print("interrupted at once; run again with --resume to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
        except _WriteFailed as e:  # disk full, directory gone or read-only: stop, keeping what is written
            bar.close()
            executor.close()
            return self._write_failed(e.error)
        except Exception as e:  # the executor broke (a worker pipe, a process that cannot start): not the disk
            bar.close()
            executor.close()
            self._reap(kinds, "of the prompts stopped at once")
            with contextlib.suppress(OSError):
                self._checkpoint(state="stopped")
                files.close()
            raise FatalError(
                f"the run stopped: its workers failed ({type(e).__name__}: {files.redact(str(e))}); the "
                f"{sum(self.counts.values())} prompts recorded this session are intact; run again with --resume"
                " (--verbose shows the traceback)"
            ) from e
        finally:
            if not quitting:
                bar.close()
                signal.signal(signal.SIGINT, signal.default_int_handler)
        # Prompts remove their own sandboxes; these are a dead worker's, or ones whose removal failed.
        self._reap(kinds, "that outlived their prompts")
        budget_stopped = self.budget is not None and self.budget.stopped and not interrupted()
        state = "interrupted" if interrupted() else "budget_spent" if budget_stopped else "finished"
        try:
            stats = self._finish(state=state)
        except OSError as e:
            return self._write_failed(e)
        print(format_summary(stats))
        if interrupted():
            print("stopped by Ctrl-C; run again with --resume to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
        if budget_stopped and stats["prompts"]["not_run"]:
            print(
                f"budget reached ({self.budget.describe()}): {stats['prompts']['not_run']} prompts not run; "
                "--resume with a larger budget runs them",
                file=sys.stderr,
            )
            return EXIT_BUDGET
        if stats["prompts"]["failed"]:
            print(
                f"{stats['prompts']['failed']} prompts failed (see failed.jsonl); --resume re-runs them",
                file=sys.stderr,
            )
            return EXIT_FAILURES
        return 0

    def _write_failed(self, e: OSError) -> int:
        """One line, no traceback: every line written before is whole, and --resume goes on from there."""
        with contextlib.suppress(OSError):
            self.files.close()
            self._checkpoint(state="write_failed")
        print(
            f"error: cannot write to {self.files.dir} ({e.strerror or e}); stopped after recording "
            f"{sum(self.counts.values())} prompts this session, all intact; free space and run again with --resume",
            file=sys.stderr,
        )
        return EXIT_WRITE_FAILED

    def _reap(self, kinds: set[str], whose: str = "left by an earlier session") -> None:
        """Remove what sandboxes of this run left behind: a killed session's, or this one's once no prompt runs."""
        # This session holds the directory's lock: every sandbox of the directory is either its own (none at
        # start; finished ones at the end) or a dead session's. Another run's, same --run_name or not, carries
        # another directory and is never touched.
        labels = {RUN_DIR_LABEL: owner_labels(self.files.dir, self.session_id)[RUN_DIR_LABEL]}
        for kind in kinds:
            try:
                n = sandboxes.reap(kind, labels)
            except Exception as e:  # no engine: a run that only may use it must not fail for it
                log.info("no %s clean-up: %s", kind, e)
                continue
            if n:
                if kind == "docker":
                    print(f"removed {n} containers {whose} of {self.cfg.run_name}", file=sys.stderr)
                else:  # local and bwrap sandboxes are told apart by their dead worker, whatever the run
                    print(f"removed {n} {kind} sandboxes whose worker had died", file=sys.stderr)

    def _warn_unavailable_tools(self) -> None:
        """One warning per missing backend, for the toolsets this distribution can sample, once at start."""
        by_reason: dict[str, list[str]] = {}
        tools = load_tools()
        for name, reason in unavailable_tools(self.cfg.tools).items():
            if tools[name].toolset in self.dist.probabilities:
                by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            print(f"warning: not offered: {', '.join(names)}: {reason}", file=sys.stderr)

    def _remaining(self) -> list[tuple[int, Entry, int]]:
        """(index, entry, sample index) of the samples not yet answered, matched by (prompt text, sample index):
        sample s of a text that occurs k times is done once k lines with that text and sample index exist."""
        budget = self.files.done_counts() if self.resume else Counter()
        remaining = []
        for i, e in enumerate(self.entries):
            k = prompt_key(e.prompt)
            for s in range(self.samples):
                if budget[k, s] > 0:
                    budget[k, s] -= 1
                else:
                    remaining.append((i, e, s))
        return remaining

    def _tasks(self, remaining: list[tuple[int, Entry, int]], first_batch: int) -> Iterator[PromptTask]:
        for j, (i, e, s) in enumerate(remaining):
            # Drawn from the prompt's index alone: every sample of a prompt gets the same tools, so its
            # samples differ only by the model's own variation (what pass@k measures).
            toolsets = sample_toolsets(self.dist, prompt_rng(self.seed, i))
            batch = first_batch + j // self.batch_size
            task = PromptTask(i, e.prompt, batch, toolsets, e.image, e.cwd, s, e.setup, e.verify, e.answers)
            self._tasks_started[task.key] = task
            self.view.started(task.key)
            yield task

    def _admit(self) -> bool:
        """Whether the budget lets one more prompt start; once nothing runs and none may, the session stops."""
        in_flight = len(self._tasks_started)
        if self.budget.may_start(in_flight):
            return True
        if in_flight == 0:
            self.budget.stopped = True
            self._stop.set()
        return False

    def _record(self, o: PromptOutcome) -> None:
        files = self.files
        task = self._tasks_started.pop(o.key, None)
        if o.status == "done":
            if files.append(files.batch_path(o.batch_num), o.record, kept=True):
                self._stats.add_trajectory(o.record)
                self._outcomes.add(o.record)
                _count_sample(o.record, self._kept)
        elif o.status == "discarded":
            files.append(files.path("discarded.jsonl"), dict(o.record, discard_reason=o.error))
        else:
            files.append(
                files.path("failed.jsonl"),
                {
                    "prompt_index": o.index,
                    "sample_index": o.sample_index,
                    "prompt": o.prompt,
                    "error": o.error,
                    "timestamp": now_iso(),
                    "batch_num": o.batch_num,
                    "usage": o.usage,
                    "stop_reason": "error",
                    "model": self.cfg.model.model,
                    "toolsets_used": list(task.toolsets) if task else [],
                },
            )
        self.counts[o.status] += 1
        if self.budget is not None:
            self.budget.add(o.usage)
        self.view.finished(o.key, o.status, o.seconds, o.usage)
        if self.cfg.verbose:
            preview = o.prompt[: self.cfg.log_prefix_chars].replace("\n", " ")
            error = f" — {o.error}" if o.error else ""
            self.view.message(f"INFO prompt {o.index} {o.status} ({o.seconds:.1f} s): {preview}{error}")

    def _install_sigint(self, stop: threading.Event):
        state = {"count": 0}

        def handler(signum, frame):
            state["count"] += 1
            if state["count"] == 1:
                stop.set()
                print(
                    "\nCtrl-C: no new prompts; letting running ones finish (Ctrl-C again to quit at once)",
                    file=sys.stderr,
                )
            else:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        return lambda: state["count"] > 0

    def _duration(self) -> float:
        return _number(self.previous.get("duration_seconds")) + (time.monotonic() - self.started)

    def _maybe_checkpoint(self) -> None:
        if time.monotonic() - self._last_checkpoint >= CHECKPOINT_SECONDS:
            self._checkpoint(state="running")

    def _checkpoint(self, state: str) -> None:
        self.files.sync()
        batches = self.files.batch_numbers()
        self.files.write_json(
            "checkpoint.json",
            {
                "run_name": self.cfg.run_name,
                "state": state,
                "dataset_file": self.dataset_file,
                "distribution": self.distribution,
                "model": self.cfg.model.model,
                "batch_size": self.batch_size,
                "total_prompts": len(self.entries),
                "this_session": dict(self.counts),
                "batches": batches,
                "last_batch": batches[-1] if batches else None,
                "sessions": int(_number(self.previous.get("sessions"))) + (1 if state != "running" else 0),
                "duration_seconds": round(self._duration(), 3),
                "updated_at": now_iso(),
            },
        )
        self._last_checkpoint = time.monotonic()

    def _finish(self, state: str) -> dict:
        """Checkpoint, merge, and statistics computed from the files themselves."""
        self._checkpoint(state=state)  # syncs the batch files first: "finished" only once every line is on disk
        self.files.close()
        stats, outcomes, kept, discarded = self._stats, self._outcomes, self._kept, Counter()

        def on_kept(record: dict) -> None:
            stats.add_trajectory(record)
            outcomes.add(record)
            _count_sample(record, kept)

        report = self.files.merge(on_kept)
        for line in self.files.discarded_records():
            stats.add_discarded(line)
            outcomes.add(line)
            _count_sample(line, discarded)
        for line in iter_records(self.files.path("failed.jsonl")):
            stats.add_failed_attempt(line)
        prompts = self._prompt_outcomes(kept, discarded)
        stats.count_failed_prompts(prompts["failed"])
        doc = stats.to_dict(
            run_name=self.cfg.run_name,
            model=self.cfg.model.model,
            distribution=self.distribution,
            prompts=prompts,
            merge={
                "kept": report.kept,
                "filtered_unknown_tool": report.unknown_tool,
                "filtered_not_json": report.not_json,
                "filtered_malformed": report.malformed,
            },
            duration_seconds=round(self._duration(), 3),
            updated_at=now_iso(),
        )
        doc["outcomes"] = outcomes.to_dict(self.samples)
        self.files.write_json("statistics.json", doc)
        return doc

    def _prompt_outcomes(self, kept: Counter, discarded: Counter) -> dict:
        """The dataset's samples (one per prompt unless --samples_per_prompt) by their last word: done,
        discarded, failed, or not run yet."""
        dataset = Counter((prompt_key(e.prompt), s) for e in self.entries for s in range(self.samples))
        failures = self.files.failure_counts()
        out = Counter(total=len(self.entries) * self.samples)
        for k, n in dataset.items():
            done = min(n, kept[k])
            disc = min(n - done, discarded[k])
            failed = min(n - done - disc, failures[k])
            out["done"] += done
            out["discarded"] += disc
            out["failed"] += failed
            out["not_run"] += n - done - disc - failed
        return {k: out[k] for k in ("total", "done", "discarded", "failed", "not_run")}


def _number(value: object) -> float:
    """A count from an earlier checkpoint; anything but a finite non-negative number (a hand edit) is 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        return 0.0
    return float(value)


def _count_sample(record: dict, into: Counter) -> None:
    if (key := sample_key(record)) is not None:
        into[key] += 1
