"""Prompt-level scheduling on worker processes, each running several prompts at once on threads.

The parent hands a prompt to a worker as soon as one of its slots is free, so a slow prompt holds up only
its own slot. Each worker has its own task queue, so the parent always knows which prompts a worker holds:
if a worker process dies, exactly those prompts are reported failed and a fresh worker takes its place.
Workers only compute and return; the parent writes every file.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Iterable, Iterator

import secrets_guard
from prompt_runner import PromptOutcome, PromptTask, RunConfig, run_prompt

_POLL_SECONDS = 0.5


def _worker_main(cfg: RunConfig, tasks: mp.Queue, results: mp.Queue, threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    secrets_guard.hold(cfg.environment)  # tool keys: in this process's memory, never in its environment
    # The imported modules are tens of thousands of objects that live as long as the process; a
    # full collection walks them all and pauses every thread of the worker (~0.17 s each while the workers
    # still imported openai, several times a run).
    gc.freeze()

    def slot() -> None:
        while True:
            task = tasks.get()
            if task is None:
                return
            results.put(run_prompt(task, cfg))

    pool = [threading.Thread(target=slot, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


class _Worker:
    def __init__(self, ctx, cfg: RunConfig, results: mp.Queue, threads: int):
        self.tasks = ctx.Queue()
        self.threads = threads
        self.held: dict[int, PromptTask] = {}
        self.process = ctx.Process(target=_worker_main, args=(cfg, self.tasks, results, threads), daemon=True)
        self.process.start()


class LocalExecutor:
    """num_workers processes × threads_per_worker slots on this machine."""

    def __init__(self, cfg: RunConfig, num_workers: int, threads_per_worker: int = 1):
        self.cfg = cfg
        self.num_workers = num_workers
        self.threads = threads_per_worker
        self._ctx = mp.get_context("spawn")  # no fork: the parent runs threads (progress bar, signals)

    def run(self, tasks: Iterable[PromptTask], stop: threading.Event) -> Iterator[PromptOutcome]:
        """Yield outcomes as prompts finish; after `stop` is set no new prompt is handed out."""
        results = self._ctx.Queue()
        workers = [_Worker(self._ctx, self.cfg, results, self.threads) for _ in range(self.num_workers)]
        pending = iter(tasks)
        exhausted = False
        try:
            while True:
                if not exhausted and not stop.is_set():
                    exhausted = _dispatch(workers, pending)
                if not any(w.held for w in workers) and (exhausted or stop.is_set()):
                    return
                try:
                    outcome: PromptOutcome = results.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    for i, w in enumerate(workers):
                        if not w.process.is_alive():
                            yield from _lost(w)
                            workers[i] = _Worker(self._ctx, self.cfg, results, self.threads)
                    continue
                for w in workers:
                    if w.held.pop(outcome.index, None) is not None:
                        break
                yield outcome
        finally:
            _shutdown(workers)


def _dispatch(workers: list[_Worker], pending: Iterator[PromptTask]) -> bool:
    """Fill every free slot; True once there is nothing left to hand out."""
    while True:
        worker = min(workers, key=lambda w: len(w.held))
        if len(worker.held) >= worker.threads:
            return False
        task = next(pending, None)
        if task is None:
            return True
        worker.held[task.index] = task
        worker.tasks.put(task)


def _lost(worker: _Worker) -> Iterator[PromptOutcome]:
    code = worker.process.exitcode
    for task in worker.held.values():
        yield PromptOutcome(
            task.index, task.prompt, task.batch_num, "failed", error=f"worker process died (exit code {code})"
        )
    worker.held.clear()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        if w.held:  # interrupted with prompts in flight: do not wait for them
            w.process.kill()
            continue
        for _ in range(w.threads):
            w.tasks.put(None)
    for w in workers:
        w.process.join(timeout=10)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.tasks.cancel_join_thread()


def default_threads(concurrency: int | None, num_workers: int) -> int:
    """Slots per worker for a total concurrency (at least one)."""
    if not concurrency:
        return 1
    return max(1, -(-concurrency // num_workers))


def cpu_count() -> int:
    return os.cpu_count() or 1
