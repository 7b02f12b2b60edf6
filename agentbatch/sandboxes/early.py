"""Whether a sample's sandbox starts beside its first model call rather than at its first command.

A sandbox's start (bwrap's namespaces and mounts, setpriv, the resident shell: ~13 ms of the machine's CPU)
made at a sample's first command is paid after the model's first reply, in the sample's wall time; and when a
wave of samples gets its first replies together, as many sandboxes start at once on a few cores (64 at once
are ~0.4 s on two: bench/RESULTS.md, (19)). Started beside the first model call, it comes up while the model
thinks. But a sample that never runs a command would pay a start for nothing (a run of questions with the
terminal offered and never called: bench (10) would pay 5,000 of them), so each worker process learns from its
own samples: it starts early while most of its last samples ran a command, and, before any of its samples has
ended, for at most its first UNPROVEN samples (what a wrong guess can cost: that many starts).
"""

from __future__ import annotations

import threading
from collections import deque

WINDOW = 16  # the last samples (offered tools) whose use decides
UNPROVEN = 64  # early starts a worker makes before any of its samples has shown whether commands come (a wave)


class EarlyStarts:
    """One worker process's choice: start a sample's sandbox early or not, learned from its samples' ends."""

    def __init__(self, window: int = WINDOW, unproven: int = UNPROVEN):
        self._lock = threading.Lock()
        self._recent: deque[bool] = deque(maxlen=window)
        self._unproven = unproven

    def want(self) -> bool:
        """Whether the next sample's sandbox starts beside its first model call."""
        with self._lock:
            if self._recent:
                return 2 * sum(self._recent) >= len(self._recent)
            if self._unproven > 0:
                self._unproven -= 1
                return True
            return False

    def learn(self, ran_commands: bool) -> None:
        """A sample that could have started early has ended: whether it ran a command in its sandbox."""
        with self._lock:
            self._recent.append(ran_commands)


policy = EarlyStarts()  # this process's; a worker forked from the runner starts with it unlearned
