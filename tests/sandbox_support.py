"""What the sandbox tests share: the sandboxes to run them in, processes found by a marker, and CPU load.

Commands inside a PID namespace see their own PIDs, not the host's, so the tests never trust a PID a
command prints: they mark the processes they start with a unique number in the command line and look
for it in the host's /proc.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import pytest

from agentbatch.sandboxes import bwrap, containment, registry
from agentbatch.sandboxes.base import Sandbox, SandboxSettings, SandboxSpec

# Each: how the prompt's sandbox is made. "local" names the containment method it must use.
KINDS = ("bwrap", "local-pidns", "local-cgroup", "local-scan")
CONTAINED = ("bwrap", "local-pidns", "local-cgroup")  # containment no command can shed (scan is the fallback)


def settings_for(kind: str, **limits) -> SandboxSettings:
    """The settings of a sandbox of this kind; skips the test (a failure under CI) if the machine cannot make it."""
    if kind == "bwrap":
        why_not = bwrap.probe(SandboxSettings(kind="bwrap", network=limits.get("network", True)))
        if why_not:
            pytest.skip(f"bwrap does not work here: {why_not}")
        return SandboxSettings(kind="bwrap", **limits)
    method = kind.split("-", 1)[1]
    if not containment.usable(method):
        pytest.skip(f"the local sandbox cannot use {method} containment here")
    return SandboxSettings(kind="local", local_containment=method, **limits)


def spec_for(kind: str, cwd: str | None = None, **limits) -> SandboxSpec:
    return SandboxSpec(settings_for(kind, **limits), cwd=cwd, run_name="test")


def create(spec: SandboxSpec) -> Sandbox:
    """A sandbox made by the spec's backend, as a sample's first tool call makes it (call its cleanup() after)."""
    return registry.get(spec.kind).create(spec)


def new_marker() -> str:
    """A number unique to the test, to put in a `sleep` and find its processes by."""
    return f"{random.randint(100000, 999999)}.{random.randint(1000, 9999)}"


def alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


def pids_with(marker: str) -> list[int]:
    """Live processes of this machine whose command line holds the marker."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if needle not in f.read():
                    continue
        except OSError:
            continue
        if alive(int(name)):
            found.append(int(name))
    return found


def wait_gone(marker: str, seconds: float) -> list[int]:
    """Poll until no process holds the marker (or the time is up); the survivors."""
    deadline = time.monotonic() + seconds
    while True:
        left = pids_with(marker)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def escapes(marker: str) -> str:
    """A command that starts, in the background, every kind of process that tries to outlive it."""
    m = marker
    return "\n".join(
        [
            f"sleep {m}1 > /dev/null 2>&1 &",
            f"nohup sleep {m}2 > /dev/null 2>&1 &",
            f"setsid sleep {m}3 > /dev/null 2>&1 &",
            f"( setsid sh -c 'sleep {m}4 & exit 0' & ) > /dev/null 2>&1",  # double fork, new session
            f"env -i sleep {m}5 > /dev/null 2>&1 &",  # drops the whole environment
            f"env -u BR_SANDBOX_ID sleep {m}6 > /dev/null 2>&1 &",
            f"BR_SANDBOX_ID=other sleep {m}7 > /dev/null 2>&1 &",
            f"bash -c 'exec -c sleep {m}8' > /dev/null 2>&1 &",
            # respawns a sleeper as fast as it can, and comes back if the sleeper is killed first
            f"( while :; do sleep {m}9 & sleep 0.01; done ) > /dev/null 2>&1 &",
            "echo started",
        ]
    )


@contextmanager
def cpu_load(processes: int = 3):
    """Busy processes beside the test, so it runs on a loaded machine."""
    burn = "import os\nwhile True:\n    os.getpid()\n"
    procs = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


class PeakTreeMemory:
    """The peak summed RSS of a process and its descendants, sampled every 50 ms while in the block."""

    def __init__(self, pid: int):
        import threading

        import psutil

        self.root = psutil.Process(pid)
        self.peak = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._halt.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            self._halt.wait(0.05)

    def __enter__(self) -> PeakTreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self._thread.join()


def freed_without_the_collector(made_and_used: Callable[[], Sandbox]) -> bool:
    """Whether the sandbox `made_and_used()` returns is freed once cleaned up and dropped, with the cyclic
    collector off: a sandbox in a reference cycle waits for the collector, whose collections then walk every
    sample in flight (bench/RESULTS.md, (10))."""
    gc.collect()
    gc.disable()
    try:
        sandbox = made_and_used()
        sandbox.cleanup()
        gone = weakref.ref(sandbox)
        del sandbox
        return gone() is None
    finally:
        gc.enable()


def sandbox_dirs_in(tmp) -> list[str]:
    """The names of the sandbox directories in a TMPDIR (the private_tmp fixture's)."""
    from agentbatch.sandboxes import sandbox_dirs

    return [p.name for p in tmp.iterdir() if p.name.startswith(sandbox_dirs.PREFIX)]
