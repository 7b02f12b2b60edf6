"""The CLI with one thing changed, for bench/bench_scale.py; only the standard library is imported before it starts.

python bench/cli_variants.py layout P ARGS...   # P worker processes forced, the sessions split over them
python bench/cli_variants.py phases FILE ARGS... # writes when each phase of the run ended to FILE
python bench/cli_variants.py steps DIR ARGS...   # each worker writes when each sample's steps began and ended
"""

from __future__ import annotations

import time

MAIN = time.monotonic()  # the interpreter and site are done: the first line of this program runs

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def layout(processes: int) -> None:
    """The CLI with `processes` worker processes, the slots split evenly over them."""
    from agentbatch import runtime
    from agentbatch.executors import capacity
    from batch_runner import cli

    def fixed(num_workers, concurrency, ray_address):
        slots = concurrency or num_workers
        plan = capacity.Plan(slots, processes, -(-slots // processes))
        capacity.reserve(plan)
        return plan

    runtime.layout = fixed
    cli()


def phases(path: str) -> None:
    """The CLI, noting the time.monotonic() at which each phase of its run ended."""
    marks = {"main": MAIN}
    import batch_runner
    from agentbatch import runtime, session
    from agentbatch.executors import processes

    marks["imported"] = time.monotonic()
    make, outcomes, finish = runtime.make_executor, processes.LocalExecutor._outcomes, session.Session._finish

    def timed_make(*args, **kwargs):
        marks["executor"] = time.monotonic()
        try:
            return make(*args, **kwargs)
        finally:
            marks["executor_made"] = time.monotonic()

    def timed_outcomes(self, *args, **kwargs):
        marks["handing_out"] = time.monotonic()
        try:
            yield from outcomes(self, *args, **kwargs)
        finally:
            marks["workers_done"] = time.monotonic()

    def timed_finish(self, *args, **kwargs):
        try:
            return finish(self, *args, **kwargs)
        finally:
            marks["finished"] = time.monotonic()

    runtime.make_executor, processes.LocalExecutor._outcomes, session.Session._finish = (
        timed_make,
        timed_outcomes,
        timed_finish,
    )
    try:
        batch_runner.cli()
    finally:
        Path(path).write_text(json.dumps(marks))


def steps(directory: str) -> None:
    """The CLI, each worker noting (thread, step, start, end) of its samples' model calls, tool calls,
    sandbox creations, commands and process starts: where the time between two calls of a sample goes."""
    import os
    import subprocess
    import threading

    from agentbatch import agent_loop
    from agentbatch.model import client
    from agentbatch.sandboxes import bwrap, docker, local
    from agentbatch.tools import context
    from batch_runner import cli

    lines: list[str] = []
    lock = threading.Lock()

    def timed(owner, name: str, step: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.monotonic()
            try:
                return inner(*args, **kwargs)
            finally:
                line = f"{threading.get_ident()} {step} {start:.6f} {time.monotonic():.6f}\n"
                with lock:
                    lines.append(line)
                    if len(lines) >= 64 or step == "chat":
                        with open(os.path.join(directory, f"steps.{os.getpid()}"), "a") as f:
                            f.writelines(lines)
                        lines.clear()

        setattr(owner, name, wrapper)

    timed(client.ModelClient, "chat", "chat")
    timed(agent_loop, "call_tool", "tool")
    timed(context.ToolContext, "sandbox", "sandbox")
    for backend in (local.LocalSandbox, bwrap.BwrapSandbox, docker.DockerSandbox):
        timed(backend, "exec", "exec")
    timed(subprocess.Popen, "__init__", "popen")
    cli()


if __name__ == "__main__":
    kind, value = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    {"layout": lambda: layout(int(value)), "phases": lambda: phases(value), "steps": lambda: steps(value)}[kind]()
