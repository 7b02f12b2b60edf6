"""The live view of a session (docs/output.md, "Progress"): samples done / failed / discarded / in flight, tokens per
second, spend and projected spend, and an ETA projected from the samples finished so far.

On a terminal one line is redrawn in place every second; anywhere else (a CI log, a file) a plain line is
printed every --progress_seconds and once at the end, so the log never holds carriage returns or escapes.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from dataclasses import dataclass, field
from typing import TextIO

from agentbatch.budget import Budget, Spend

TERMINAL_REFRESH = 1.0


@dataclass
class Snapshot:
    """What the view shows, at one moment."""

    total: int
    done: int = 0
    failed: int = 0
    discarded: int = 0
    in_flight: int = 0
    elapsed: float = 0.0
    tokens_per_second: float = 0.0
    spent: float | None = None  # USD; None when no cost is known
    spent_label: str = "this session"
    projected: float | None = None
    budget: float | None = None
    eta: float | None = None  # seconds; None until a sample has finished, and while only overdue ones run
    ages: list[float] = field(default_factory=list)
    overdue: float | None = None  # with no ETA: how long the longest of the samples running past the mean has run

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.discarded


class Progress:
    """Counts what the session reports and shows it; thread-safe (a refresh thread reads, the session writes)."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        interval: float,
        slots: int,
        budget: Budget | None = None,
        priced: bool = False,
        terminal: bool | None = None,
    ):
        self.total, self.stream, self.slots, self.budget, self.priced = total, stream, max(1, slots), budget, priced
        self.terminal = stream.isatty() if terminal is None else terminal
        self.interval = TERMINAL_REFRESH if self.terminal else interval
        self._lock = threading.Lock()
        self._counts = {"done": 0, "failed": 0, "discarded": 0}
        self._running: dict[int, float] = {}
        self._seconds = 0.0
        self._spend = Spend()  # this session's
        self._began = time.monotonic()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def start(self) -> None:
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._refresh, name="progress", daemon=True)
        self._thread.start()

    def started(self, key: int) -> None:
        with self._lock:
            self._running[key] = time.monotonic()

    def finished(self, key: int, status: str, seconds: float, usage: dict | None) -> None:
        with self._lock:
            self._running.pop(key, None)
            self._counts[status] = self._counts.get(status, 0) + 1
            self._seconds += seconds
            self._spend.add(usage)

    def message(self, text: str) -> None:
        """A line of its own (a --verbose sample line, a notice), kept clear of the live line."""
        with self._lock:
            self._write(("\r\x1b[K" if self._drawn else "") + text + "\n")
            self._drawn = False
            if self.terminal:
                self._draw(self._snapshot())

    def close(self) -> None:
        """Stop refreshing; a last line says where the session ended (only once, and only if it started)."""
        if self._thread is None or self._halt.is_set():
            return
        self._halt.set()
        self._thread.join()
        with self._lock:
            if self.terminal:
                self._draw(self._snapshot())
                self._write("\n")
            else:
                self._write(plain_line(self._snapshot()) + "\n")
            self._drawn = False

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot()

    def _refresh(self) -> None:
        while not self._halt.wait(self.interval):
            with self._lock:
                snap = self._snapshot()
                if self.terminal:
                    self._draw(snap)
                else:
                    self._write(plain_line(snap) + "\n")

    def _draw(self, snap: Snapshot) -> None:
        width = shutil.get_terminal_size((120, 20)).columns
        # Never wider than the terminal: a wrapped line could not be redrawn in place.
        self._write("\r" + live_line(snap, max(20, width - 1)) + "\x1b[K")
        self._drawn = True

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stderr must not stop the run

    def _snapshot(self) -> Snapshot:
        now = time.monotonic()
        c = self._counts
        finished = c["done"] + c["failed"] + c["discarded"]
        elapsed = now - self._began
        snap = Snapshot(
            self.total,
            c["done"],
            c["failed"],
            c["discarded"],
            len(self._running),
            elapsed,
            self._spend.tokens / elapsed if elapsed > 0 else 0.0,
            ages=[now - t for t in self._running.values()],
        )
        budget = self.budget
        spend = self._spend
        if budget is not None:  # the budget knows what earlier sessions spent too
            spend, snap.spent_label, snap.budget = budget.spent, "run", budget.settings.usd
        spent, mean = spend.cost, (spend.cost / spend.attempts if spend.attempts else None)
        if self.priced or spent > 0:
            snap.spent = spent
            if mean is not None:
                snap.projected = spent + mean * (self.total - finished)
        if finished:
            not_started = self.total - finished - snap.in_flight
            if budget is not None:
                left = budget.samples_left(snap.in_flight)
                if left is not None:
                    not_started = min(not_started, left)
            snap.eta = eta(self._seconds / finished, snap.ages, not_started, self.slots)
            if snap.eta is None:
                snap.overdue = max(snap.ages)
        return snap


def eta(mean_seconds: float, ages: list[float], not_started: int, slots: int) -> float | None:
    """Seconds until the session ends, from the mean duration of finished samples (not from batches).

    Each running sample is expected to take the mean in all (its remainder: the mean minus its age); the
    samples not started share the slots; the end is no sooner than the longest remainder. A sample running
    past the mean has no remainder to expect: once only such samples are left there is no estimate (None),
    never a 0 while something still runs.
    """
    remainders = [mean_seconds - a for a in ages if a < mean_seconds]
    if not_started <= 0 and not remainders:
        return None if ages else 0.0
    work = sum(remainders) + max(0, not_started) * mean_seconds
    return max(max(remainders, default=0.0), work / max(1, slots))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def _fields(snap: Snapshot) -> list[tuple[int, str]]:
    """(priority, text) in display order; a narrow terminal keeps the lowest priorities."""
    out = [
        (0, f"{snap.finished}/{snap.total}"),
        (1, f"done {snap.done}"),
        (4, f"failed {snap.failed}"),
        (5, f"discarded {snap.discarded}"),
        (2, f"in flight {snap.in_flight}"),
        (6, f"{_rate(snap.tokens_per_second)} tok/s"),
    ]
    if snap.spent is not None:
        whose = f"of ${snap.budget:g} budget" if snap.budget else snap.spent_label
        money = f"${snap.spent:.2f} {whose}"
        if snap.projected is not None:
            money += f", ~${snap.projected:.2f} projected"
        out.append((3, money))
    if snap.eta is not None:  # rounded up: a session with anything left never says 0s
        out.append((1, f"ETA {_duration(math.ceil(snap.eta))}"))
    else:
        out.append((1, f"ETA ? (running {_duration(snap.overdue)})" if snap.overdue is not None else "ETA ?"))
    return out


def live_line(snap: Snapshot, width: int = 10_000) -> str:
    """The terminal line, at most `width` characters: the least important fields go first when it is narrow."""
    fields = _fields(snap)
    kept = set(range(len(fields)))
    for i in sorted(kept, key=lambda i: -fields[i][0]):
        if len(" | ".join(fields[j][1] for j in sorted(kept))) <= width:
            break
        kept.discard(i)
    return " | ".join(fields[j][1] for j in sorted(kept))[:width]


def plain_line(snap: Snapshot) -> str:
    return f"progress [{_duration(snap.elapsed)}]: " + " | ".join(text for _, text in _fields(snap))
