"""One session of a run: what is left to run, handing it to the executor as slots free, and the end of it.

Its files are written by run_dir (Recorder: a line per outcome and the checkpoint; merge.py: trajectories.jsonl)
and its statistics computed by run_statistics; the session decides what runs, when, and how it ends.
"""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agentbatch.budget import Budget, BudgetSettings
from agentbatch.dataset import Entry
from agentbatch.errors import FatalError
from agentbatch.executors.base import Executor
from agentbatch.progress import Progress
from agentbatch.run_dir import answers
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.lock import session_lock
from agentbatch.run_dir.merge import merge
from agentbatch.run_dir.paths import FAILED, STATISTICS, TOOLS
from agentbatch.run_dir.recorder import Recorder, RunFacts
from agentbatch.run_statistics import Tally, format_summary
from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import RUN_DIR_LABEL, owner_labels
from agentbatch.terminal_text import safe
from agentbatch.tool_set import ToolSet
from agentbatch.tools.registry import load_tools, unavailable_tools
from agentbatch.work import RunConfig, SampleOutcome, SampleTask, now_iso
from toolset_distributions import Distribution, prompt_rng, sample_toolsets

log = logging.getLogger("batch_runner")
EXIT_FAILURES = 3
EXIT_INTERRUPTED = 130
EXIT_WRITE_FAILED = 2
EXIT_BUDGET = 4


def new_session_id() -> str:
    """A session's id, unique on every machine and readable: start time, pid and a random part."""
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class SessionSettings:
    """Everything a session needs besides its executor, built once from the settings (launch.session_settings)."""

    cfg: RunConfig
    run_dir: str
    entries: list[Entry]
    batch_size: int
    distribution: Distribution
    seed: int | None = None
    resume: bool = False
    samples_per_prompt: int = 1
    dataset_file: str = ""
    session_id: str = field(default_factory=new_session_id)
    sandbox_note: str = ""  # which sandbox runs the samples, printed as the session starts
    budget: BudgetSettings = field(default_factory=BudgetSettings)
    progress_seconds: float = 10.0
    slots: int = 1  # samples the executor runs at once, for the ETA
    priced: bool = False  # costs are known (prices given, or an endpoint that reports them)
    # Given the exit code once the session is over, while it still holds the run's lock (the --export of a run).
    at_end: Callable[[int], int] | None = None


def sample_task(e: Entry, index: int, sample: int, batch: int, toolsets: list[str]) -> SampleTask:
    """The sample of an entry handed to a worker: its index (the line's prompt_index), batch and toolsets."""
    return SampleTask(
        index,
        e.prompt,
        batch,
        toolsets,
        e.image,
        e.cwd,
        sample,
        e.setup,
        e.verify,
        e.answers,
        e.identity,
        metadata=e.metadata,
        resources=e.resources,
        limits=e.limits,
        hooks=e.hooks,
        unavailable=e.unavailable,
    )


class _WriteFailed(Exception):
    """Writing a file of the run directory failed (disk full, directory gone): not any other OSError."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


class Session:
    """Runs the samples not yet done and records each outcome as it arrives; the only writer of the run dir."""

    def __init__(self, settings: SessionSettings):
        s = self.s = settings
        self.cfg, self.session_id = s.cfg, s.session_id
        self.files = RunFiles(s.run_dir, secrets=s.cfg.secrets)
        # This session's trajectories are counted as they are written, so the merge at the end copies their
        # lines instead of reading each back (RunFiles.append).
        self.tally = Tally()
        facts = RunFacts(
            s.cfg.run_name, s.cfg.model.model, s.dataset_file, s.distribution.name, s.batch_size, len(s.entries)
        )
        self.recorder = Recorder(self.files, facts, self.tally.add_trajectory)
        self.budget: Budget | None = None
        self.view: Progress | None = None
        self._in_flight: dict[tuple[int, int], SampleTask] = {}
        self._stop = threading.Event()
        self._kinds: set[str] = set()  # the sandbox kinds this session may create
        self._first_batch = 0

    def run(self, executor: Executor) -> int:
        """Run the session holding the run directory's lock: one session at a time, whatever else starts."""
        with session_lock(self.files.paths, self.session_id, now_iso()):
            code = self._run(executor)
            if self.s.at_end is None:
                return code
            return self.s.at_end(code)

    # A Python caller's rollouts (rollout_run.py) record into a run directory through these three: the
    # session's start, each outcome as it arrives, and its end; it holds the lock (`lock`) in between.
    def lock(self) -> contextlib.AbstractContextManager:
        """The run directory's lock, held by this session."""
        return session_lock(self.files.paths, self.session_id, now_iso())

    def begin(self) -> list[tuple[int, Entry, int]]:
        """The session's start (refusal of another run, tools.json, dead sessions' sandboxes): what is left."""
        return self._start()

    def record(self, outcome: SampleOutcome, task: SampleTask | None) -> None:
        """An outcome's line written (raises OSError), its spend counted."""
        self.recorder.record(outcome, task)
        if self.budget is not None:
            self.budget.add(outcome.usage)

    def batch(self, number: int) -> int:
        """The batch file of the `number`th sample handed out this session."""
        return self._first_batch + number // self.s.batch_size

    def end(self, state: str) -> dict:
        """The session's end: sandboxes left behind removed, checkpoint, merge, statistics (raises OSError)."""
        self._kinds |= self.s.cfg.sandbox.kinds(images=any(e.image for e in self.s.entries))  # the entries given since
        self._reap(self._kinds, "that outlived their prompts")
        return self._finish(state)

    def _run(self, executor: Executor) -> int:
        remaining = self._start()
        before = signal.getsignal(signal.SIGINT)
        interrupted = self._install_sigint(self._stop)
        view = self.view = Progress(
            len(remaining), sys.stderr, self.s.progress_seconds, self.s.slots, self.budget, self.s.priced
        )
        quitting = False
        try:
            self._schedule(executor, remaining)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # quitting at once: a third Ctrl-C must not cut the clean-up
            quitting = True
            view.close()
            return self._quit_at_once(executor)
        except _WriteFailed as e:  # disk full, directory gone or read-only: stop, keeping what is written
            view.close()
            executor.close()
            return self._write_failed(e.error)
        except Exception as e:  # the executor broke (a worker pipe, a process that cannot start): not the disk
            view.close()
            raise self._workers_failed(executor, e) from e
        finally:
            if not quitting:
                view.close()
                signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)
        # Samples remove their own sandboxes, the last ones on their workers' closer threads (closing.py) until the
        # workers exit: so they exit first. What is left is a dead worker's, or ones whose removal failed.
        executor.close()
        self._reap(self._kinds, "that outlived their samples")
        budget_stopped = self.budget is not None and self.budget.stopped and not interrupted()
        try:
            stats = self._finish("interrupted" if interrupted() else "budget_spent" if budget_stopped else "finished")
        except OSError as e:
            return self._write_failed(e)
        print(format_summary(stats))
        return self._exit_code(stats, interrupted(), budget_stopped)

    def _start(self) -> list[tuple[int, Entry, int]]:
        """Refuse to mix two runs, ready the directory, clean up after dead sessions; what is left to run."""
        s, paths = self.s, self.files.paths
        if paths.holds_run() and not s.resume:
            raise FatalError(
                f"{paths.dir} already holds a run; add --resume to continue it, or choose another --run_name"
            )
        try:
            self.recorder.start()
        except OSError as e:  # e.g. a directory named failed.jsonl: named, as the file it is
            raise FatalError(f"cannot write to {e.filename or paths.dir}: {e.strerror}") from None
        self._kinds = s.cfg.sandbox.kinds(images=any(e.image for e in s.entries))
        self._reap(self._kinds)
        self._warn_unavailable_tools()
        self._use_tools()
        reader = self.files.reader()
        for note in reader.notes():
            print(f"warning: {note}", file=sys.stderr)
        # Matched by content (README, "Resume"): each row's identity, or the prompt text of older lines.
        done = answers.done_counts(reader) if s.resume else Counter()
        remaining = answers.remaining(s.entries, s.samples_per_prompt, done)
        self._first_batch = paths.next_batch()
        if s.sandbox_note:
            print(s.sandbox_note, file=sys.stderr)
        samples, total = s.samples_per_prompt, len(s.entries) * s.samples_per_prompt
        what = f"{len(s.entries)} prompts × {samples} samples" if samples > 1 else f"{total} prompts"
        if s.entries:  # a caller's rollouts give their tasks later: rollout_run.py says where they go
            print(
                f"{what}, {total - len(remaining)} already done, {len(remaining)} to run -> {paths.dir}",
                file=sys.stderr,
            )
        if s.budget.active:
            self.budget = Budget(s.budget, reader.spend())
            if remaining and not self.budget.may_start(0):  # already spent: no workers to start
                self.budget.stopped, remaining = True, []
        return remaining

    def _schedule(self, executor: Executor, remaining: list[tuple[int, Entry, int]]) -> None:
        """Hand the samples out as slots free (the budget permitting) and record each outcome as it arrives."""
        if not remaining:  # a finished run resumed: no workers to spawn, only merge and statistics
            return
        admit = self._admit if self.budget is not None else None
        outcomes = executor.run(self._tasks(remaining), self._stop, admit)
        self.view.start()
        for outcome in outcomes:
            try:
                self.recorder.record(outcome, self._in_flight.pop(outcome.key, None))
            except OSError as e:
                raise _WriteFailed(e) from e
            self._finished(outcome)

    def _tasks(self, remaining: list[tuple[int, Entry, int]]) -> Iterator[SampleTask]:
        s = self.s
        for j, (i, e, sample) in enumerate(remaining):
            # Drawn from the prompt's index alone: every sample of a prompt gets the same tools, so its
            # samples differ only by the model's own variation (what pass@k measures).
            toolsets = sample_toolsets(s.distribution, prompt_rng(s.seed, i))
            batch = self.batch(j)
            task = sample_task(e, i, sample, batch, toolsets)
            self._in_flight[task.key] = task
            self.view.started(task.key)
            yield task

    def _admit(self) -> bool:
        """Whether the budget lets one more sample start; once nothing runs and none may, the session stops."""
        in_flight = len(self._in_flight)
        if self.budget.may_start(in_flight):
            return True
        if in_flight == 0:
            self.budget.stopped = True
            self._stop.set()
        return False

    def _finished(self, o: SampleOutcome) -> None:
        """An outcome recorded: its spend counts against the budget, and the live view shows it."""
        if self.budget is not None:
            self.budget.add(o.usage)
        self.view.finished(o.key, o.status, o.seconds, o.usage)
        if self.cfg.verbose:
            preview = o.prompt[: self.cfg.log_prefix_chars].replace("\n", " ")
            error = f" — {o.error}" if o.error else ""
            self.view.message(
                safe(f"INFO prompt {o.index} sample {o.sample_index} {o.status} ({o.seconds:.1f} s): {preview}{error}")
            )

    def _finish(self, state: str) -> dict:
        """Checkpoint, merge, and statistics computed from the files themselves."""
        self.recorder.checkpoint(state)  # syncs the batch files first: "finished" only once every line is on disk
        self.files.close()
        merged = merge(self.files, self.tally.add_trajectory)
        s = self.s
        run = {
            "run_name": s.cfg.run_name,
            "model": s.cfg.model.model,
            "distribution": s.distribution.name,
            "duration_seconds": round(self.recorder.duration(), 3),
            "updated_at": now_iso(),
        }
        doc = self.tally.document(self.files.reader(), s.entries, s.samples_per_prompt, merged, run)
        self.files.write_json(STATISTICS, doc)
        return doc

    def _exit_code(self, stats: dict, interrupted: bool, budget_stopped: bool) -> int:
        """The session's exit code (docs/output.md), with the line that says what to do next."""
        samples = stats["samples"]
        if interrupted:
            print("stopped by Ctrl-C; run again with --resume to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
        if budget_stopped and samples["not_run"]:
            print(
                f"budget reached ({self.budget.describe()}): {samples['not_run']} samples not run; "
                "--resume with a larger budget runs them",
                file=sys.stderr,
            )
            return EXIT_BUDGET
        if samples["failed"]:
            print(f"{samples['failed']} samples failed (see {FAILED}); --resume re-runs them", file=sys.stderr)
            return EXIT_FAILURES
        return 0

    def _quit_at_once(self, executor: Executor) -> int:
        """A second Ctrl-C: workers stop first, so none starts a container after the reap."""
        executor.close()
        self._reap(self._kinds, "of the samples stopped at once")
        self.recorder.checkpoint("interrupted")
        self.files.close()
        print("interrupted at once; run again with --resume to finish", file=sys.stderr)
        return EXIT_INTERRUPTED

    def _workers_failed(self, executor: Executor, e: Exception) -> FatalError:
        """Stop what runs, keep what is recorded, and say so in one line."""
        executor.close()
        self._reap(self._kinds, "of the samples stopped at once")
        with contextlib.suppress(OSError):
            self.recorder.checkpoint("stopped")
            self.files.close()
        return FatalError(
            f"the run stopped: its workers failed ({type(e).__name__}: {self.files.redact(str(e))}); the "
            f"{self.recorder.recorded} samples recorded this session are intact; run again with --resume"
            " (--verbose shows the traceback)"
        )

    def _write_failed(self, e: OSError) -> int:
        """One line, no traceback: every line written before is whole, and --resume goes on from there."""
        with contextlib.suppress(OSError):
            self.files.close()
            self.recorder.checkpoint("write_failed")
        print(
            f"error: cannot write to {self.files.dir} ({e.strerror or e}); stopped after recording "
            f"{self.recorder.recorded} samples this session, all intact; free space and run again with --resume",
            file=sys.stderr,
        )
        return EXIT_WRITE_FAILED

    def _reap(self, kinds: set[str], whose: str = "left by an earlier session") -> None:
        """Remove what sandboxes of this run left behind: a killed session's, or this one's once no sample runs."""
        # This session holds the directory's lock: every sandbox of the directory is either its own (none at
        # start; finished ones at the end) or a dead session's. Another run's, same --run_name or not, carries
        # another directory and is never touched.
        labels = {RUN_DIR_LABEL: owner_labels(self.files.dir, self.session_id)[RUN_DIR_LABEL]}
        for kind in kinds:
            backend = sandbox_backends.get(kind)
            try:
                n = backend.reap(labels)
            except Exception as e:  # no engine: a run that only may use it must not fail for it
                log.info("no %s clean-up: %s", kind, e)
                continue
            if n:
                print(backend.reaped(n, f"{whose} of {self.cfg.run_name}"), file=sys.stderr)

    def _use_tools(self) -> None:
        """The run's tools: this session's, recorded in tools.json at the run's start. A run resumed with other
        tools says what changed and goes on with both: its lines then have entries for the tools of both."""
        paths, run = self.files.paths, self.cfg.tool_set
        # A run from before tools.json was kept had the built-in tools.
        recorded = self.files.reader().recorded_tools() or (ToolSet() if paths.holds_run() else None)
        changes = run.changes(recorded) if recorded is not None else []
        if changes:
            run = run.union(recorded)
            print(
                f"warning: this run was started with other tools: {'; '.join(changes)}. The samples still to run "
                "are offered this session's tools; the run's lines now have entries for the tools of both "
                f"({TOOLS} records them)",
                file=sys.stderr,
            )
        try:
            self.files.write_json(TOOLS, run.record())
        except OSError as e:
            raise FatalError(f"cannot write to {paths.dir}: {e.strerror}") from None
        self.files.use_tools(run)
        self.tally = Tally(run.names)
        self.recorder.on_trajectory = self.tally.add_trajectory

    def _warn_unavailable_tools(self) -> None:
        """One warning per missing backend, for the toolsets this distribution can sample and the run's own toolsets
        it offers to every sample, once at start."""
        by_reason: dict[str, list[str]] = {}
        tools, dist = load_tools(), self.s.distribution
        for name, reason in unavailable_tools(self.cfg.tools).items():
            if tools[name].toolset in dist.probabilities or tools[name].toolset in dist.always:
                by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            print(f"warning: not offered: {', '.join(names)}: {reason}", file=sys.stderr)

    def _install_sigint(self, stop: threading.Event):
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # Started with Ctrl-C ignored (a script's background job, as POSIX shells start them): it stays
            # ignored, as it is while plug-ins load and in `serve`; SIGTERM stops such a run (README).
            return lambda: False
        state = {"count": 0}

        def handler(signum, frame):
            state["count"] += 1
            if state["count"] == 1:
                stop.set()
                print(
                    "\nCtrl-C: no new samples; letting running ones finish (Ctrl-C again to quit at once)",
                    file=sys.stderr,
                )
            else:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        return lambda: state["count"] > 0
