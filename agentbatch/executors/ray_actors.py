"""Scale-out on Ray: the same sample-level scheduling as processes.LocalExecutor, on the actors of a Ray cluster.

Why threaded actors and not `ray.util.multiprocessing.Pool`: the work is waiting on model endpoints, so
one process holds many samples at once on threads (`max_concurrency=threads`) and shares one HTTP
connection pool, exactly as a local worker does. The parent submits one `run.remote(task)` per free slot
and keeps each ObjectRef with the actor it went to, which gives what Pool cannot: at most
num_workers × threads samples in flight (Pool.imap submits the whole iterable up front), no new sample
after `stop` is set, and a dead actor's samples reported as failed outcomes (its refs raise
RayActorError) while a fresh actor takes its place. Actors only compute and return outcomes; the
parent, the only writer, records them.

`address`: "local" starts a private Ray instance (and shuts it down at the end); "auto" joins the
cluster this machine belongs to; "ray://head:10001" connects through Ray Client. The runner's own
modules travel to the workers as `runtime_env={"py_modules": [...]}`, so a cluster needs no copy of
this project, but its nodes need the same Python and Ray versions as the driver and the runner's
dependencies (`pip install "batch-runner[ray]"` in the cluster image, or add them to the runtime_env).
The run configuration, API key included, is sent to the actors through Ray's object store.
Actors reserve no CPU (they mostly wait) and are spread over the nodes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator

import ray
from ray.exceptions import RayActorError, RayError

import agentbatch.plugins as plugins
import agentbatch.process_guard as process_guard
import agentbatch.run_tools as run_tools
from agentbatch.executors.base import END_SECONDS, Admit, Slots, lost
from agentbatch.model import rate_limit
from agentbatch.sample_runner import WorkerClients
from agentbatch.sandboxes import closing
from agentbatch.work import RunConfig, SampleOutcome, SampleTask

_POLL_SECONDS = 0.5


@ray.remote(num_cpus=0, concurrency_groups={"control": 1})
class SampleActor:
    """One Ray worker process running up to max_concurrency samples on threads (its slots)."""

    def __init__(self, cfg: RunConfig):
        process_guard.guard_worker(cfg.secrets, die_with_parent=False)  # Ray, not its parent, ends an actor
        self.cfg = cfg
        plugins.load(cfg.plugins)  # the files a run named must exist on the actor's node too
        run_tools.install(cfg.tool_set)  # the MCP servers' tools, as the runner listed them at start
        self.clients = WorkerClients(cfg)

    def run(self, task: SampleTask) -> SampleOutcome:
        return self.clients.run(task)

    @ray.method(concurrency_group="control")  # answers even while every slot is busy
    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="control")
    def handed_out(self) -> None:
        """Every task of the run is handed out: the samples this actor holds are its last."""
        rate_limit.last_samples()

    @ray.method(concurrency_group="control")
    def end(self) -> None:
        """Before Ray kills the actor: end what its tools started with subprocess and left running. Ray's own end
        of a worker's children reaches its direct children only; what those started went on running. Its samples'
        sandboxes are removed first (closing.py)."""
        closing.drain()
        process_guard.end_own_children()


class RayExecutor:
    """num_workers Ray actors × threads_per_worker slots, on the cluster at `address`."""

    def __init__(self, cfg: RunConfig, address: str, num_workers: int, threads_per_worker: int = 1):
        self.cfg = cfg
        self.address = address
        self.num_workers = num_workers
        self.threads = threads_per_worker
        self.actors: list = []  # the live actor of each worker, for tests that kill one
        self._running: Iterator[SampleOutcome] | None = None

    def run(
        self, tasks: Iterable[SampleTask], stop: threading.Event, admit: Admit | None = None
    ) -> Iterator[SampleOutcome]:
        self._running = self._outcomes(tasks, stop, admit)
        return self._running

    def wake(self) -> None:
        """Tasks that can be had now are asked for at the next poll (every _POLL_SECONDS)."""

    def cancel(self, keys) -> None:
        """Not on Ray: a cancelled sample's outcome comes back when it ends as it would have."""

    def kill(self) -> None:
        """On Ray the actors are killed when the run's loop ends (close)."""

    def close(self) -> None:
        if self._running is not None:
            self._running.close()  # its finally kills the actors

    def _outcomes(
        self, tasks: Iterable[SampleTask], stop: threading.Event, admit: Admit | None
    ) -> Iterator[SampleOutcome]:
        started = self._connect()
        refs: dict[ray.ObjectRef, tuple[int, object, SampleTask]] = {}
        slots = Slots(self.num_workers, self.threads)

        def send(worker: int, task: SampleTask) -> None:
            actor = self.actors[worker]
            refs[actor.run.remote(task)] = (worker, actor, task)

        try:
            self.actors = [self._actor() for _ in range(self.num_workers)]
            pending = iter(tasks)
            exhausted = False
            while True:
                if not exhausted and not stop.is_set():
                    exhausted = slots.fill(pending, send, admit)
                    if exhausted:
                        for actor in self.actors:
                            actor.handed_out.remote()
                if not refs and (exhausted or stop.is_set()):
                    return
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=_POLL_SECONDS)
                if ready:  # take everything already finished, not one per round trip
                    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
                for ref in ready:
                    worker, actor, task = refs.pop(ref)
                    slots.release(task.key)
                    yield self._outcome(ref, worker, actor, task)
        finally:
            with contextlib.suppress(Exception):  # a dead actor's end fails; the others' still run
                ray.wait([a.end.remote() for a in self.actors], num_returns=len(self.actors), timeout=END_SECONDS)
            for actor in self.actors:
                ray.kill(actor)
            self.actors = []
            if started:
                ray.shutdown()

    def _connect(self) -> bool:
        """Join or start Ray; True when this executor started it (and so must shut it down)."""
        if ray.is_initialized():
            return False
        runtime_env = {"py_modules": _project_modules()}
        if self.address == "local":
            ray.init(
                num_cpus=max(os.cpu_count() or 1, self.num_workers),
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.WARNING,
                runtime_env=runtime_env,
            )
        else:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING, runtime_env=runtime_env)
        return True

    def _actor(self):
        return SampleActor.options(max_concurrency=self.threads, scheduling_strategy="SPREAD").remote(self.cfg)

    def _outcome(self, ref, worker: int, actor, task: SampleTask) -> SampleOutcome:
        try:
            return ray.get(ref)
        except RayActorError as e:
            if self.actors[worker] is actor:  # the first of its samples to report the death replaces it
                self.actors[worker] = self._actor()
            return lost(task, f"Ray actor died: {_first_line(e)}")
        except RayError as e:  # the worker crashed or the outcome could not travel back
            return lost(task, f"Ray task failed: {_first_line(e)}")


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return (text.splitlines() or [type(e).__name__])[0][:300]


def _project_modules() -> list[str]:
    """What a worker imports of this project: the package directory and the top-level modules it uses."""
    import toolset_distributions
    import trajectory

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [package, os.path.abspath(trajectory.__file__), os.path.abspath(toolset_distributions.__file__)]
