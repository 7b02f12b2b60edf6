"""Where the samples in flight run: worker processes × slots (threads) for `--concurrency` samples, and the
OS limits they need.

A sample in flight mostly waits on the endpoint, so its slot is a thread, not a process: a worker process
holds up to SLOTS_PER_PROCESS of them, and there are never more processes than usable cores, however
many samples are asked for at once, since more interpreters would only add start-up time and memory. The
limits the slots need (open files, threads, local ports) are raised to their hard ceilings when short, slots
are spread over more processes when one process may not open enough files, and a machine that cannot give
enough stops the run before it starts, with one line naming the limit.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

from agentbatch.errors import FatalError

# Slots per process before another process is worth its start-up: at this many, one process's share of
# the GIL still keeps up with replies (bench/RESULTS.md, figure (8): the layouts of 32 samples in flight).
SLOTS_PER_PROCESS = 128
# A sample's keep-alive connection, its sandbox's resident shell (request, status and output pipes, the command's
# memfd: held from its first model call where its sandbox starts early), and a command's or a file operation's
# pipes while it runs (a docker client's socket in their place).
FILES_PER_SLOT = 8
FILES_PER_PROCESS = 64  # the interpreter's own, the pipes to the parent, imported libraries
THREADS_PER_PROCESS = 8  # beyond the slots: the main thread, helpers of the libraries
MAX_PROCESSES = 256


@dataclass(frozen=True)
class Plan:
    """Where the samples run: `processes` × `threads` slots, at most `slots` samples in flight."""

    slots: int
    processes: int
    threads: int


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def plan(slots: int, cores: int | None = None, open_files: int | None = None) -> Plan:
    """Processes (at most one per core unless the open-file limit asks for more) × threads for `slots` samples."""
    cores = cores or usable_cores()
    processes = min(cores, -(-slots // SLOTS_PER_PROCESS))
    files = open_files if open_files is not None else _hard(resource.RLIMIT_NOFILE)
    if files is not None:
        per_process = (files - FILES_PER_PROCESS) // FILES_PER_SLOT
        if per_process < 1 or -(-slots // per_process) > MAX_PROCESSES:
            raise FatalError(
                f"{slots} samples in flight need about {slots * FILES_PER_SLOT + FILES_PER_PROCESS} open files, "
                f"but a process may open only {files} (ulimit -Hn): raise the limit or lower --concurrency"
            )
        processes = max(processes, -(-slots // per_process))
    processes = max(1, min(processes, slots))
    return Plan(slots, processes, -(-slots // processes))


def reserve(p: Plan) -> None:
    """Raise the soft limits the plan needs to their hard ceilings, or stop with the limit that is short."""
    _raise_soft(resource.RLIMIT_NOFILE, p.threads * FILES_PER_SLOT + FILES_PER_PROCESS)
    threads = p.slots + p.processes * THREADS_PER_PROCESS
    room = thread_room()
    if room is not None and threads > room[0]:
        raise FatalError(
            f"{p.slots} samples in flight need about {threads} threads, but this machine allows {room[0]} more "
            f"({room[1]}): lower --concurrency or raise the limit"
        )
    ports = local_ports()
    if ports is not None and p.slots > ports:
        raise FatalError(
            f"{p.slots} samples in flight need one local port each, but only {ports} are free for outgoing "
            "connections (net.ipv4.ip_local_port_range): lower --concurrency or widen the range"
        )


def thread_room() -> tuple[int, str] | None:
    """How many more threads this process may start, and the limit that says so; None when nothing is known."""
    rooms: list[tuple[int, str]] = []
    if os.geteuid() != 0:  # root is not held to RLIMIT_NPROC
        wanted = _raise_soft(resource.RLIMIT_NPROC, None)
        if wanted is not None:
            rooms.append((wanted - _count_user_threads(), "ulimit -u"))
    pids = _cgroup_pids()
    if pids is not None:
        rooms.append((pids, "the cgroup's pids.max"))
    threads_max = _read_int("/proc/sys/kernel/threads-max")
    if threads_max is not None:
        rooms.append((threads_max - _count_threads(), "kernel.threads-max"))
    return min(rooms) if rooms else None


def local_ports() -> int | None:
    """How many local ports outgoing connections may use."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        return None
    return high - low + 1


def _hard(limit: int) -> int | None:
    hard = resource.getrlimit(limit)[1]
    return None if hard == resource.RLIM_INFINITY else hard


def _raise_soft(limit: int, wanted: int | None) -> int | None:
    """Raise the soft limit to `wanted` (None: to the hard limit) within the hard one; returns the soft limit."""
    soft, hard = resource.getrlimit(limit)
    target = hard if wanted is None else wanted
    if hard != resource.RLIM_INFINITY:
        target = min(target, hard)
    if soft != resource.RLIM_INFINITY and (target == resource.RLIM_INFINITY or target > soft):
        try:
            resource.setrlimit(limit, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def _cgroup_pids() -> int | None:
    """Room left under the pids.max of this process's cgroup (v2), if it has one."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.split("::", 1)[1].strip() for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if path is None:
        return None
    base = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    try:
        with open(os.path.join(base, "pids.max")) as f:
            text = f.read().strip()
    except OSError:
        return None
    current = _read_int(os.path.join(base, "pids.current"))
    if text == "max" or current is None:
        return None
    return int(text) - current


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _count_threads() -> int:
    """Threads on the machine now (the third field of /proc/loadavg is running/total)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def _count_user_threads() -> int:
    # Counting every process's threads for one user needs a /proc walk; the machine total bounds it.
    return _count_threads()
