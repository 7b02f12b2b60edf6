"""Prompt-level scheduling on worker processes, each running several prompts at once on threads.

Each worker has its own task queue, so the parent always knows which prompts a worker holds: if a worker
process dies, exactly those prompts are reported failed and a fresh worker takes its place.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue
import signal
import threading
from collections.abc import Iterable, Iterator

from agentbatch.executors.base import Slots, lost
from agentbatch.prompt_runner import Clients, PromptOutcome, PromptTask, RunConfig, run_prompt

_POLL_SECONDS = 0.5


def _worker_main(cfg: RunConfig, tasks: mp.Queue, results: mp.Queue, threads: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    clients = Clients.for_config(cfg)  # one connection pool set per thread, shared SSL context
    # The imported modules are tens of thousands of objects that live as long as the process; a full
    # collection walks them all and pauses every thread of the worker (bench/RESULTS.md).
    gc.freeze()

    def slot() -> None:
        while True:
            task = tasks.get()
            if task is None:
                return
            results.put(run_prompt(task, cfg, clients))

    pool = [threading.Thread(target=slot, daemon=True) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


class _Worker:
    def __init__(self, ctx, cfg: RunConfig, results: mp.Queue, threads: int):
        self.tasks = ctx.Queue()
        self.process = ctx.Process(target=_worker_main, args=(cfg, self.tasks, results, threads), daemon=True)
        self.process.start()


class LocalExecutor:
    """num_workers processes × threads_per_worker slots on this machine."""

    def __init__(self, cfg: RunConfig, num_workers: int, threads_per_worker: int = 1):
        self.cfg = cfg
        self.num_workers = num_workers
        self.threads = threads_per_worker
        self._ctx = mp.get_context("spawn")  # no fork: the parent runs threads (progress bar, signals)
        self._running: Iterator[PromptOutcome] | None = None

    def run(self, tasks: Iterable[PromptTask], stop: threading.Event) -> Iterator[PromptOutcome]:
        self._running = self._outcomes(tasks, stop)
        return self._running

    def close(self) -> None:
        if self._running is not None:
            self._running.close()  # its finally shuts the workers down

    def _outcomes(self, tasks: Iterable[PromptTask], stop: threading.Event) -> Iterator[PromptOutcome]:
        results = self._ctx.Queue()
        workers = [_Worker(self._ctx, self.cfg, results, self.threads) for _ in range(self.num_workers)]
        slots = Slots(self.num_workers, self.threads)
        pending = iter(tasks)
        exhausted = False
        try:
            while True:
                if not exhausted and not stop.is_set():
                    exhausted = slots.fill(pending, lambda w, task: workers[w].tasks.put(task))
                if not slots.busy and (exhausted or stop.is_set()):
                    return
                try:
                    outcome: PromptOutcome = results.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    for i, w in enumerate(workers):
                        if not w.process.is_alive():
                            error = f"worker process died (exit code {w.process.exitcode})"
                            yield from (lost(task, error) for task in slots.take(i))
                            workers[i] = _Worker(self._ctx, self.cfg, results, self.threads)
                    continue
                slots.release(outcome.key)
                yield outcome
        finally:
            _shutdown(workers, slots)


def _shutdown(workers: list[_Worker], slots: Slots) -> None:
    for i, w in enumerate(workers):
        if slots.held[i]:  # interrupted with prompts in flight: do not wait for them
            w.process.kill()
            continue
        for _ in range(slots.per_worker):
            w.tasks.put(None)
    for w in workers:
        w.process.join(timeout=10)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.tasks.cancel_join_thread()
