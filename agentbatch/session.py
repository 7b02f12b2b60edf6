"""One session of a run: resume matching, scheduling, writing every file, merge and statistics."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

from tqdm import tqdm

from agentbatch import sandboxes
from agentbatch.dataset import Entry
from agentbatch.errors import FatalError
from agentbatch.executors.base import Executor
from agentbatch.prompt_runner import PromptOutcome, PromptTask, RunConfig, now_iso
from agentbatch.run_files import RunFiles, iter_records, prompt_key
from agentbatch.run_statistics import RunStats, format_summary
from agentbatch.tools.registry import unavailable_tools
from toolset_distributions import TOOLSET_OF, Distribution, prompt_rng, sample_toolsets
from trajectory import first_human

log = logging.getLogger("batch_runner")
CHECKPOINT_SECONDS = 2.0
EXIT_FAILURES = 3
EXIT_INTERRUPTED = 130
EXIT_WRITE_FAILED = 2


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
    ):
        self.cfg, self.files, self.entries = cfg, files, entries
        self.batch_size, self.dist, self.seed, self.resume = batch_size, dist, seed, resume
        self.counts = Counter()
        self.distribution = dist.name
        self.dataset_file = ""
        self.sandbox_note = ""
        self.started = time.monotonic()
        self.previous = {}
        self._last_checkpoint = 0.0

    def run(self, executor: Executor) -> int:
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
        print(
            f"{len(self.entries)} prompts, {len(self.entries) - len(remaining)} already done, "
            f"{len(remaining)} to run -> {files.dir}",
            file=sys.stderr,
        )
        stop = threading.Event()
        interrupted = self._install_sigint(stop)
        bar = tqdm(total=len(remaining), unit="prompt", file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
        quitting = False
        try:
            # Nothing left (a finished run resumed): no workers to spawn, only merge and statistics.
            outcomes = executor.run(self._tasks(remaining, first_batch), stop) if remaining else ()
            for outcome in outcomes:
                self._record(outcome)
                bar.update(1)
                bar.set_postfix(
                    done=self.counts["done"],
                    failed=self.counts["failed"],
                    discarded=self.counts["discarded"],
                    refresh=False,
                )
                self._maybe_checkpoint()
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
        except OSError as e:  # disk full, directory gone or read-only: stop, keeping what is written
            bar.close()
            executor.close()
            return self._write_failed(e)
        finally:
            bar.close()
            if not quitting:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        # Prompts remove their own sandboxes; these are a dead worker's, or ones whose removal failed.
        self._reap(kinds, "that outlived their prompts")
        try:
            stats = self._finish(state="interrupted" if interrupted() else "finished")
        except OSError as e:
            return self._write_failed(e)
        print(format_summary(stats))
        if interrupted():
            print("stopped by Ctrl-C; run again with --resume to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
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
        for kind in kinds:
            try:
                n = sandboxes.reap(kind, self.cfg.run_name)
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
        for name, reason in unavailable_tools(self.cfg.tools).items():
            if TOOLSET_OF[name] in self.dist.probabilities:
                by_reason.setdefault(reason, []).append(name)
        for reason, names in by_reason.items():
            print(f"warning: not offered: {', '.join(names)}: {reason}", file=sys.stderr)

    def _remaining(self) -> list[tuple[int, Entry]]:
        """Entries not yet answered, matched by prompt text: k copies are done once k lines answer them."""
        budget = self.files.done_counts() if self.resume else Counter()
        remaining = []
        for i, e in enumerate(self.entries):
            k = prompt_key(e.prompt)
            if budget[k] > 0:
                budget[k] -= 1
            else:
                remaining.append((i, e))
        return remaining

    def _tasks(self, remaining: list[tuple[int, Entry]], first_batch: int) -> Iterator[PromptTask]:
        for j, (i, e) in enumerate(remaining):
            toolsets = sample_toolsets(self.dist, prompt_rng(self.seed, i))
            yield PromptTask(i, e.prompt, first_batch + j // self.batch_size, toolsets, e.image, e.cwd)

    def _record(self, o: PromptOutcome) -> None:
        files = self.files
        if o.status == "done":
            files.append(files.batch_path(o.batch_num), o.record)
        elif o.status == "discarded":
            files.append(files.path("discarded.jsonl"), dict(o.record, discard_reason=o.error))
        else:
            files.append(
                files.path("failed.jsonl"),
                {
                    "prompt_index": o.index,
                    "prompt": o.prompt,
                    "error": o.error,
                    "timestamp": now_iso(),
                    "batch_num": o.batch_num,
                    "usage": o.usage,
                },
            )
        self.counts[o.status] += 1
        if self.cfg.verbose:
            preview = o.prompt[: self.cfg.log_prefix_chars].replace("\n", " ")
            log.info(
                "prompt %d %s (%.1f s): %s%s", o.index, o.status, o.seconds, preview, f" — {o.error}" if o.error else ""
            )

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
        return float(self.previous.get("duration_seconds") or 0.0) + (time.monotonic() - self.started)

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
                "sessions": int(self.previous.get("sessions") or 0) + (1 if state != "running" else 0),
                "duration_seconds": round(self._duration(), 3),
                "updated_at": now_iso(),
            },
        )
        self._last_checkpoint = time.monotonic()

    def _finish(self, state: str) -> dict:
        """Checkpoint, merge, and statistics computed from the files themselves."""
        self.files.close()
        self._checkpoint(state=state)
        stats = RunStats()
        kept, discarded = Counter(), Counter()

        def on_kept(record: dict) -> None:
            stats.add_trajectory(record)
            _count_prompt(record, kept)

        report = self.files.merge(on_kept)
        for line in iter_records(self.files.path("discarded.jsonl")):
            stats.add_discarded(line)
            _count_prompt(line, discarded)
        for line in iter_records(self.files.path("failed.jsonl")):
            stats.add_failed_attempt(line)
        prompts = self._prompt_outcomes(kept, discarded)
        doc = stats.to_dict(
            run_name=self.cfg.run_name,
            model=self.cfg.model.model,
            distribution=self.distribution,
            prompts=prompts,
            merge={
                "kept": report.kept,
                "filtered_unknown_tool": report.unknown_tool,
                "filtered_not_json": report.not_json,
            },
            duration_seconds=round(self._duration(), 3),
            updated_at=now_iso(),
        )
        self.files.write_json("statistics.json", doc)
        return doc

    def _prompt_outcomes(self, kept: Counter, discarded: Counter) -> dict:
        """Dataset prompts by their last word: done, discarded, failed, or not run yet."""
        dataset = Counter(prompt_key(e.prompt) for e in self.entries)
        failures = self.files.failure_counts()
        out = Counter(total=len(self.entries))
        for k, n in dataset.items():
            done = min(n, kept[k])
            disc = min(n - done, discarded[k])
            failed = min(n - done - disc, failures[k])
            out["done"] += done
            out["discarded"] += disc
            out["failed"] += failed
            out["not_run"] += n - done - disc - failed
        return {k: out[k] for k in ("total", "done", "discarded", "failed", "not_run")}


def _count_prompt(record: dict, into: Counter) -> None:
    prompt = first_human(record)
    if isinstance(prompt, str):
        into[prompt_key(prompt)] += 1
