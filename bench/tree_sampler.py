"""The CLI's process tree sampled while it runs: peak summed RSS, and each process's last CPU seconds seen.

The sampler shares the two cores with what it measures, so its own cost is part of every wall-clock figure:
psutil's walk of a tree (a read of every process's /proc/N/stat to find the children, then statm and stat again
for each child) cost ~90 ms of CPU a sample with 800 processes, 1.67 s of a 10.4 s (19) run at 1,000 × 2, ~8 %
of the machine it measured (bench/RESULTS.md, issue 38). Here one read of each /proc/N/stat gives the tree and
the CPU, and statm is read only for the tree's own processes (RSS as psutil gives it, statm's resident); and the
next sample waits at least 19 times what the last one took, so the sampler keeps under 5 % of one core however
many processes the run has (every 0.1 s when it has few).
"""

from __future__ import annotations

import os
import threading
import time

INTERVAL = 0.1  # seconds between samples, at least
SHARE = 0.05  # of one core, at most
_PAGE = os.sysconf("SC_PAGE_SIZE")
_HZ = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _processes() -> dict[int, tuple[int, float]]:
    """Every process of the machine: pid -> (its parent's pid, its CPU seconds), from its /proc/N/stat."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        data = _read(f"/proc/{name}/stat")
        if not data:
            continue
        fields = data[data.rfind(b")") + 2 :].split()  # after the name, which may hold spaces and parentheses
        table[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _HZ)
    return table


def tree_of(root: int) -> tuple[dict[int, float], int]:
    """The tree under `root` now: {pid: CPU seconds} of its processes, and their summed RSS in bytes."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    cpu, rss, todo = {}, 0, [root]
    while todo:
        pid = todo.pop()
        if pid not in table:
            continue
        statm = _read(f"/proc/{pid}/statm")
        if statm is None:
            continue  # ended since
        cpu[pid] = table[pid][1]
        rss += int(statm.split()[1]) * _PAGE
        todo += children.get(pid, [])
    return cpu, rss


class TreeSampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants, sampled every INTERVAL s or less often (SHARE)."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root = pid
        self.peak = 0
        self.peak_procs = 0
        self.cpu: dict[int, float] = {}  # last CPU seconds seen per process, for the parent/worker split
        self.spent = 0.0  # the sampler's own CPU seconds
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            began = time.thread_time()
            cpu, total = tree_of(self.root)
            if not cpu:
                return  # the root has ended
            self.cpu.update(cpu)
            if total > self.peak:
                self.peak, self.peak_procs = total, len(cpu)
            took = time.thread_time() - began
            self.spent += took
            self._halt.wait(max(INTERVAL, took * (1 - SHARE) / SHARE))

    def stop(self) -> None:
        self._halt.set()
        self.join()
