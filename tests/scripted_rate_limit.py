"""The scripted server's rate-limited mode: `rate` chat requests a second are accepted and 429 answered beyond
that, as hosted endpoints do, either by a token bucket (up to `burst` at once, by default one second's worth)
or (`window=True`) by a sliding one-second window that holds at most `rate` accepted requests.

Every answer carries OpenAI's headers (x-ratelimit-limit-requests, -remaining-requests, -reset-requests:
"0.44s", the time until the bucket is full again); a 429 also carries Retry-After (whole seconds, at least
1, as HTTP has it) and retry-after-ms (the precise wait for the next token). `headers=False` leaves all of
them out but Retry-After, for clients that must cope without; `retry_after=False` as well leaves a bare 429.
`schedule` moves the limit: [(seconds since the first request, rate from then on), ...], e.g.
[(0, 200), (10, 50), (30, 200)]. Standard library only.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque


class RateLimit:
    """A token bucket or sliding window over chat requests, with a count of what it accepted and refused."""

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        headers: bool = True,
        *,
        window: bool = False,
        retry_after: bool = True,
        schedule: list[tuple[float, float]] | None = None,
    ):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, rate))
        self.headers = headers
        self.window = window
        self.retry_after = retry_after
        self.schedule = sorted((float(t), float(r)) for t, r in schedule) if schedule else [(0.0, self.rate)]
        self._tokens = self.burst
        self._last = time.monotonic()
        self._window: deque[float] = deque()  # monotonic times of the accepted requests of the last second
        self._lock = threading.Lock()
        self.accepted = 0
        self.refused = 0
        self.origin: float | None = None  # time.time() of the first request: the schedule's zero
        self._origin_mono = 0.0
        self.first_accepted: float | None = None  # time.time() of the first and last accepted request
        self.last_accepted: float | None = None
        self.accepted_at: list[float] = []  # time.time() of each accepted request, to see the rate it ran at
        self.refused_at: list[float] = []  # time.time() of each refusal, to see when they came

    def rate_at(self, since_origin: float) -> float:
        """The limit in force `since_origin` seconds after the first request."""
        i = bisect.bisect_right([t for t, _ in self.schedule], since_origin) - 1
        return self.schedule[max(i, 0)][1]

    def take(self) -> tuple[bool, dict[str, str]]:
        """(accepted, the response headers) for one request arriving now."""
        with self._lock:
            now, wall = time.monotonic(), time.time()
            if self.origin is None:
                self.origin, self._origin_mono = wall, now
            rate = self.rate_at(now - self._origin_mono)
            if self.window:
                while self._window and self._window[0] <= now - 1.0:
                    self._window.popleft()
                accepted = len(self._window) < math.floor(rate)
                tokens = math.floor(rate) - len(self._window) - accepted
                wait = (self._window[0] + 1.0 - now) if self._window and not accepted else 0.0
            else:
                self._tokens = min(self.burst, self._tokens + (now - self._last) * rate)
                self._last = now
                accepted = self._tokens >= 1.0
                self._tokens -= accepted
                tokens = self._tokens
                wait = (1.0 - tokens) / rate
            if accepted:
                if self.window:
                    self._window.append(now)
                self.accepted += 1
                self.first_accepted = self.first_accepted or wall
                self.last_accepted = wall
                self.accepted_at.append(wall)
            else:
                self.refused += 1
                self.refused_at.append(wall)
        headers: dict[str, str] = {}
        limit = math.floor(rate) if self.window else int(self.burst)
        if self.headers:
            refill = 1.0 if self.window else (self.burst - tokens) / rate
            headers = {
                "x-ratelimit-limit-requests": str(limit),
                "x-ratelimit-remaining-requests": str(int(tokens)),
                "x-ratelimit-reset-requests": f"{refill:.3f}s",
            }
        if not accepted:
            if self.retry_after:
                headers["Retry-After"] = str(max(1, math.ceil(wait)))
            if self.headers:
                headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return accepted, headers

    def stats(self) -> dict:
        with self._lock:
            return {
                "rate": self.rate,
                "burst": self.burst,
                "window": self.window,
                "schedule": self.schedule,
                "origin": self.origin,
                "accepted": self.accepted,
                "refused": self.refused,
                "first_accepted": self.first_accepted,
                "last_accepted": self.last_accepted,
                "accepted_at": list(self.accepted_at),
                "refused_at": list(self.refused_at),
            }
