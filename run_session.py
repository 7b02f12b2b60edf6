"""One session of a run: settings from flags, resume matching, scheduling, writing, merge and statistics."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from tqdm import tqdm

import cli_options as opt
import secrets_guard
from cli_options import FatalError
from dataset import Entry, load_entries
from model_client import ModelSettings
from prompt_runner import PromptOutcome, PromptTask, RunConfig, now_iso
from run_files import RunFiles, iter_records, prompt_key
from statistics_report import RunStats, format_summary
from tool_registry import TOOLSET_OF, ToolSettings, unavailable_tools
from toolset_distributions import get_distribution, prompt_rng, sample_toolsets
from trajectory import first_human

log = logging.getLogger("batch_runner")
CHECKPOINT_SECONDS = 2.0
EXIT_FAILURES = 3
EXIT_INTERRUPTED = 130
EXIT_WRITE_FAILED = 2


def run_from_flags(f: dict[str, Any]) -> int:
    """Check every flag, then run; returns the exit code."""
    if f["dataset_file"] is None:
        raise FatalError('--dataset_file is required: a JSONL file with one {"prompt": ...} per line')
    if f["batch_size"] is None:
        raise FatalError("--batch_size is required: how many prompts go in each batch file")
    name = opt.run_name(f["run_name"])
    batch_size = opt.positive_int("batch_size", f["batch_size"])
    num_workers = opt.positive_int("num_workers", f["num_workers"])
    concurrency = opt.positive_int("concurrency", f["concurrency"]) if f["concurrency"] is not None else None
    max_samples = opt.positive_int("max_samples", f["max_samples"]) if f["max_samples"] is not None else None
    dist = get_distribution(str(f["distribution"]))
    sandbox = opt.sandbox_kind(f["sandbox"], os.environ.get("TERMINAL_ENV"))
    seed = f["seed"]
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FatalError(f"--seed must be a whole number, got {seed!r}")
    verbose = opt.boolean("verbose", f["verbose"])
    resume = opt.boolean("resume", f["resume"])
    prefill = opt.prefill_messages(f["prefill_messages_file"])
    model = str(f["model"])
    local = model == "local" or f["base_url"] == "local"

    entries, warnings = load_entries(str(f["dataset_file"]), max_samples)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not entries:
        raise FatalError(
            f'no valid entries in {f["dataset_file"]}: each line needs a JSON object with a "prompt" string'
        )

    # Before anything is started: no child process inherits a credential (secrets_guard).
    environment = secrets_guard.withdraw_environment()
    with ExitStack() as stack:
        if local:
            import local_model

            base_url = stack.enter_context(local_model.serve(f["local_model_path"], verbose=verbose))
            model = "local"
        else:
            base_url = opt.base_url(f["base_url"])
        key = opt.api_key(f["api_key"], base_url, needed=not local)
        # Keys travel to workers inside the config, never through their environment; the model key once.
        tool_environment = {k: v for k, v in environment.items() if k not in MODEL_KEY_VARS}
        # A sandboxed command running as our user could read the key from /proc/<runner>/cmdline or environ.
        secrets_guard.hide_from_proc([key])
        model_settings = ModelSettings(
            model=model,
            base_url=base_url,
            api_key=key,
            request_timeout=opt.positive_float("request_timeout", f["request_timeout"]),
            max_retries=opt.positive_int("max_retries", f["max_retries"], minimum=0),
            providers_allowed=opt.name_list("providers_allowed", f["providers_allowed"]),
            providers_ignored=opt.name_list("providers_ignored", f["providers_ignored"]),
            providers_order=opt.name_list("providers_order", f["providers_order"]),
            provider_sort=opt.provider_sort(f["provider_sort"]),
            reasoning_effort=opt.reasoning_effort(f["reasoning_effort"]),
            reasoning_disabled=opt.boolean("reasoning_disabled", f["reasoning_disabled"]),
        )
        tool_settings = ToolSettings(
            base_url=base_url,
            api_key=key,
            model=model,
            vision_model=f["vision_model"],
            image_model=f["image_model"] or os.environ.get("IMAGE_MODEL"),
            image_base_url=f["image_base_url"],
            moa_models=opt.name_list("moa_models", f["moa_models"]),
            moa_aggregator=f["moa_aggregator"],
            allow_private_urls=opt.boolean("allow_private_urls", f["allow_private_urls"]) or local,
            command_timeout=opt.positive_float("command_timeout", f["command_timeout"]),
            request_timeout=model_settings.request_timeout,
        )
        cfg = RunConfig(
            run_name=name,
            model=model_settings,
            tools=tool_settings,
            max_turns=opt.positive_int("max_turns", f["max_turns"]),
            system_prompt=f["ephemeral_system_prompt"],
            prefill=prefill,
            require_reasoning=opt.boolean("require_reasoning", f["require_reasoning"]),
            sandbox_kind=sandbox,
            docker_image=f["docker_image"],
            docker_memory=opt.docker_memory(f["docker_memory"]),
            docker_cpus=opt.positive_float("docker_cpus", f["docker_cpus"]),
            docker_pids=opt.positive_int("docker_pids", f["docker_pids"]),
            verbose=verbose,
            log_prefix_chars=opt.positive_int("log_prefix_chars", f["log_prefix_chars"], minimum=0),
            environment=tool_environment,
        )
        files = RunFiles(os.path.join(str(f["output_dir"]), name), secrets=(key, *environment.values()))
        session = Session(cfg, files, entries, batch_size, dist, seed, resume)
        session.distribution = dist.name
        session.dataset_file = str(f["dataset_file"])
        executor = _executor(cfg, num_workers, concurrency, f["ray_address"])
        return session.run(executor)


def _executor(cfg: RunConfig, num_workers: int, concurrency: int | None, ray_address: Any):
    from workers import LocalExecutor, default_threads

    threads = default_threads(concurrency, num_workers)
    if ray_address:
        from ray_executor import RayExecutor

        return RayExecutor(cfg, str(ray_address), num_workers, threads)
    return LocalExecutor(cfg, num_workers, threads)


MODEL_KEY_VARS = ("OPENROUTER_API_KEY", "OPENAI_API_KEY")


class Session:
    """Runs the prompts not yet done and records each outcome as it arrives; the only writer of the run dir."""

    def __init__(self, cfg, files: RunFiles, entries: list[Entry], batch_size, dist, seed, resume: bool):
        self.cfg, self.files, self.entries = cfg, files, entries
        self.batch_size, self.dist, self.seed, self.resume = batch_size, dist, seed, resume
        self.counts = Counter()
        self.distribution = dist.name
        self.dataset_file = ""
        self.started = time.monotonic()
        self.previous = {}
        self._last_checkpoint = 0.0

    def run(self, executor) -> int:
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
        _reap_containers(self.cfg)
        self._warn_unavailable_tools()
        remaining = self._remaining()
        first_batch = max(files.batch_numbers(), default=-1) + 1
        print(
            f"{len(self.entries)} prompts, {len(self.entries) - len(remaining)} already done, "
            f"{len(remaining)} to run -> {files.dir}",
            file=sys.stderr,
        )
        stop = threading.Event()
        interrupted = self._install_sigint(stop)
        bar = tqdm(total=len(remaining), unit="prompt", file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
        outcomes = ()
        quitting = False
        containers = self.cfg.sandbox_kind == "docker" or any(e.image for _, e in remaining)
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
            if containers:
                if hasattr(outcomes, "close"):
                    outcomes.close()  # workers stop first, so none starts a container after the reap
                _reap_containers(self.cfg, "of the prompts stopped at once")
            self._checkpoint(state="interrupted")
            files.close()
            print("interrupted at once; run again with --resume to finish", file=sys.stderr)
            return EXIT_INTERRUPTED
        except OSError as e:  # disk full, directory gone or read-only: stop, keeping what is written
            bar.close()
            if hasattr(outcomes, "close"):
                outcomes.close()
            return self._write_failed(e)
        finally:
            bar.close()
            if not quitting:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        if containers:  # prompts remove their own; these are a dead worker's, or ones whose removal failed
            _reap_containers(self.cfg, "that outlived their prompts")
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


def _reap_containers(cfg: RunConfig, whose: str = "left by an earlier session") -> None:
    """Remove the run's labelled containers: a killed earlier session's, or this one's once no prompt runs."""
    try:
        import sandbox_docker
    except ImportError:
        return
    try:
        n = sandbox_docker.reap_containers(cfg.run_name)
    except Exception as e:  # no engine: local runs must not need one
        log.info("no container reaping: %s", e)
        return
    if n:
        print(f"removed {n} containers {whose} of {cfg.run_name}", file=sys.stderr)
