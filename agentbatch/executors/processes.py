"""Sample-level scheduling on worker processes, each running several samples at once on threads (its slots).

Each worker has its own two pipes (tasks in, outcomes out), so the parent always knows which samples a
worker holds and which worker an outcome came from. A worker's death shows at once on its process
sentinel: the outcomes it sent first are recorded, exactly the samples it still held fail, and a fresh
worker takes its place.

Workers start when the executor is made, before the session's threads (progress bar, signals) exist, and
are forked: a forked worker runs its first sample within milliseconds, with every module already imported,
where a spawned interpreter spent ~0.3-0.7 s importing them again (bench/RESULTS.md). A worker started
later, to replace a dead one, is spawned: forking a process whose other threads may hold a lock (a
stream's, an allocator's) can leave that lock held forever in the child.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import queue
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from multiprocessing.connection import Connection, wait

import agentbatch.plugins as plugins
import agentbatch.process_guard as process_guard
import agentbatch.run_tools as run_tools
from agentbatch.executors.base import END_SECONDS, Admit, Slots, lost
from agentbatch.model import rate_limit
from agentbatch.sample_runner import WorkerClients
from agentbatch.sandboxes import closing
from agentbatch.tools.registry import load_tools
from agentbatch.work import Cancel, HandedOut, RunConfig, SampleOutcome, SampleTask

_POLL_SECONDS = 0.5
_STOP = None  # the message that tells a worker's threads to finish


def _worker_main(cfg: RunConfig, tasks: Connection, results: Connection, threads: int, inherited=()) -> None:
    """A worker process: `threads` slots, each taking a task, running it and sending its outcome back."""
    process_guard.guard_worker(cfg.secrets)  # dies with the runner; memory unreadable; logs redacted
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked while the parent forked
    for conn in inherited:  # a forked worker's copies of the parent's pipe ends: EOF must mean the parent left
        conn.close()
    _name_process("br-worker")
    plugins.load(cfg.plugins)  # a forked worker has them already; a spawned one imports them here
    run_tools.install(cfg.tool_set)  # the MCP servers' tools, as the runner listed them at start
    clients = WorkerClients(cfg)  # one connection per thread, one TLS context for all
    # The imported modules are tens of thousands of objects that live as long as the process; a full
    # collection walks them all and pauses every thread of the worker (bench/RESULTS.md).
    gc.freeze()
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    give, count = threading.Lock(), threading.Lock()
    waiting = [0]  # threads between samples, each about to take one from the inbox
    cancels: dict[tuple[int, int], threading.Event] = {}  # every sample received and not yet done

    def run(task: SampleTask) -> bool:
        try:
            outcome = clients.run(task, cancels.get(task.key))
        except BaseException as e:  # it never raises; were it to, the sample fails rather than stays in flight
            outcome = lost(task, f"internal error: {type(e).__name__}: {e}")
        with count:
            cancels.pop(task.key, None)
        try:
            with give:
                results.send(outcome)
        except OSError:  # the parent is gone: nobody is left to record it
            return False
        return True

    def slot(task: SampleTask) -> None:
        while task is not _STOP and run(task):
            with count:
                waiting[0] += 1
            task = inbox.get()

    pool: list[threading.Thread] = []
    # This thread reads the pipe into the inbox, so the parent's sends never wait on a busy slot. A thread is
    # started when a sample finds none waiting: a run never starts more than it has samples in flight.
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):  # the parent is gone
            task = _STOP
        if task is _STOP:
            break
        if isinstance(task, HandedOut):
            rate_limit.last_samples()
            continue
        if isinstance(task, Cancel):
            with count:
                for key in task.keys:
                    if key in cancels:
                        cancels[key].set()
            continue
        with count:
            cancels[task.key] = threading.Event()
            idle = waiting[0] > 0
            waiting[0] -= idle
        if idle or len(pool) >= threads:
            if pool:
                inbox.put(task)
            elif not run(task):  # no thread could be started: this one runs the samples
                break
            continue
        t = threading.Thread(target=slot, args=(task,), daemon=True)
        try:
            t.start()
            pool.append(t)
        except RuntimeError as e:  # the machine gives no more threads: run with fewer, fail no sample for it
            print(f"warning: a worker runs {len(pool)} of its {threads} threads ({e})", file=sys.stderr)
            threads = len(pool)
            if pool:
                inbox.put(task)
            elif not run(task):
                break
    _finish(pool, inbox)


def _finish(pool: list[threading.Thread], inbox: queue.SimpleQueue) -> None:
    """A worker's end: every slot told to stop and joined, its samples' sandboxes removed (closing.py), then what
    its tools started with subprocess and left running ended (process_guard)."""
    for _ in pool:
        inbox.put(_STOP)
    for t in pool:
        t.join()
    closing.drain()
    process_guard.end_own_children()


def _name_process(name: str) -> None:
    """What ps, top and psutil call the worker (its command line is the runner's when forked)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/comm", "w") as f:
            f.write(name)


@contextlib.contextmanager
def _sigint_blocked():
    """Ctrl-C waits while a worker starts, so it lands in the parent's handler, never in a half-made worker."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Worker:
    """A worker process and the parent's ends of its pipes."""

    def __init__(self, ctx, cfg: RunConfig, threads: int, inherited: list[Connection]):
        task_end, self.tasks = mp.Pipe(duplex=False)
        self.sending = threading.Lock()  # a cancel may be sent from another thread than the tasks
        self.results, result_end = mp.Pipe(duplex=False)
        forked = ctx.get_start_method() == "fork"
        own = [*inherited, self.tasks, self.results] if forked else []
        self.process = ctx.Process(
            target=_worker_main, args=(cfg, task_end, result_end, threads, own), daemon=True, name="br-worker"
        )
        with _sigint_blocked():
            self.process.start()
        task_end.close()  # the worker's ends: only the worker may hold them, so its death is an EOF here
        result_end.close()

    def send(self, task) -> None:
        try:
            with self.sending:
                self.tasks.send(task)
        except OSError:  # it died: its sentinel says so, and the samples it held are failed then
            pass

    def kill(self) -> None:
        """Kill the worker at once, and every process below it (what its tools and sandboxes started)."""
        if self.process.pid is not None and self.process.exitcode is None:
            process_guard.end_tree(self.process.pid)
        self.process.kill()

    def close(self) -> None:
        self.tasks.close()
        self.results.close()


class LocalExecutor:
    """`processes` worker processes × `threads` slots on this machine, at most `slots` samples at once."""

    def __init__(self, cfg: RunConfig, processes: int, threads: int = 1, slots: int | None = None):
        self.cfg = cfg
        self.threads = threads
        self.slots = slots or processes * threads
        self._spawn = mp.get_context("spawn")
        # Forking is safe only while this is the process's one thread (see the module docstring).
        single = threading.active_count() == 1 and sys.platform == "linux"
        ctx = mp.get_context("fork") if single else self._spawn
        load_tools()  # imported once here, inherited by every forked worker
        # What ends the wait for outcomes at once when more tasks can be had (a Python caller's, wake()).
        self._woken, self._waker = mp.Pipe(duplex=False)
        self._slots: Slots | None = None
        # Whatever exists now lives as long as the run: no collection, here or in a forked worker, need walk it
        # (nor touch its pages, which the workers share with this process until written).
        gc.freeze()
        self.workers: list[_Worker] = []
        for _ in range(processes):
            self.workers.append(_Worker(ctx, cfg, threads, self._parent_ends()))
        self._running: Iterator[SampleOutcome] | None = None
        self._stopped = False  # told to stop (or killed)
        self._closed = False  # and waited for

    def run(
        self, tasks: Iterable[SampleTask], stop: threading.Event, admit: Admit | None = None
    ) -> Iterator[SampleOutcome]:
        self._running = self._outcomes(tasks, stop, admit)
        return self._running

    def close(self) -> None:
        """Stop the workers and wait for them: idle ones are told to finish, ones still holding samples are killed.

        A run whose samples all came back told its workers to finish then (see _outcomes) and waits for them
        here, before the session's last reap: a worker removes its last samples' sandboxes before it exits.
        """
        if self._running is not None:
            self._running.close()  # its finally tells the workers to stop
        if not self._stopped:
            self._stopped = True
            _stop(self.workers, None)
        if not self._closed:
            self._closed = True
            _join(self.workers)
            self._woken.close()
            self._waker.close()

    def wake(self) -> None:
        """More tasks may be had, or may be admitted now: the running loop asks at once, not at its next poll."""
        with contextlib.suppress(OSError):
            self._waker.send_bytes(b"")

    def cancel(self, keys: Iterable[tuple[int, int]]) -> None:
        """End these samples in flight at their next model call or tool (their outcomes still come back)."""
        slots, by_worker = self._slots, {}
        if slots is None:
            return
        for key in keys:
            for i, held in enumerate(list(slots.held)):
                if key in held:
                    by_worker.setdefault(i, []).append(key)
        for i, held_keys in by_worker.items():
            self.workers[i].send(Cancel(tuple(held_keys)))

    def kill(self) -> None:
        """Kill the workers holding samples now (from any thread): the running loop fails exactly those samples."""
        slots = self._slots
        for i, w in enumerate(list(self.workers)):
            if slots is None or slots.held[i]:
                w.kill()

    def _parent_ends(self) -> list[Connection]:
        return [self._woken, self._waker, *(c for w in self.workers for c in (w.tasks, w.results))]

    def _outcomes(
        self, tasks: Iterable[SampleTask], stop: threading.Event, admit: Admit | None
    ) -> Iterator[SampleOutcome]:
        workers = self.workers
        slots = self._slots = Slots(len(workers), self.threads, total=self.slots)
        pending = iter(tasks)
        exhausted = False
        try:
            while True:
                if not exhausted and not stop.is_set():
                    exhausted = slots.fill(pending, lambda w, task: workers[w].send(task), admit)
                    if exhausted:  # (a rate-limited endpoint is then probed no further: pacer.last_samples)
                        for w in workers:
                            w.send(HandedOut())
                if not slots.busy and (exhausted or stop.is_set()):
                    return
                watched = [w.results for w in workers] + [w.process.sentinel for w in workers] + [self._woken]
                ready = set(wait(watched, _POLL_SECONDS))
                if self._woken in ready:
                    while self._woken.poll():
                        self._woken.recv_bytes()
                for i, w in enumerate(list(workers)):
                    dead = w.process.sentinel in ready
                    if w.results in ready or dead:
                        outcomes, eof = _drain(w.results, 0.5 if dead else 0.0)  # a dead one's last words too
                        for outcome in outcomes:
                            slots.release(outcome.key)
                            yield outcome
                        dead = dead or eof
                    if dead:
                        w.process.join(timeout=5)
                        error = f"worker process died (exit code {w.process.exitcode})"
                        yield from (lost(task, error) for task in slots.take(i))
                        w.close()
                        workers[i] = _Worker(self._spawn, self.cfg, self.threads, [])
        finally:
            self._stopped = True
            _stop(workers, slots)


def _drain(conn: Connection, timeout: float) -> tuple[list[SampleOutcome], bool]:
    """The outcomes waiting in a worker's pipe, and whether it reached its end (the worker is gone)."""
    out = []
    try:
        while conn.poll(timeout):
            out.append(conn.recv())
    except (EOFError, OSError):
        return out, True
    return out, False


def _stop(workers: list[_Worker], slots: Slots | None) -> None:
    for i, w in enumerate(workers):
        if slots is not None and slots.held[i]:  # interrupted with samples in flight: do not wait for them
            w.kill()
        else:
            w.send(_STOP)


def _join(workers: list[_Worker]) -> None:
    for w in workers:
        w.process.join(timeout=END_SECONDS)
        if w.process.is_alive():
            w.kill()
            w.process.join(timeout=5)
        w.close()
