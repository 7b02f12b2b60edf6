"""The scripted server's rate-limited mode: a token bucket that accepts `rate` requests a second (up to
`burst` at once, by default one second's worth) and answers 429 beyond that, as hosted endpoints do.

Every answer carries OpenAI's headers (x-ratelimit-limit-requests, -remaining-requests, -reset-requests:
"0.44s", the time until the bucket is full again); a 429 also carries Retry-After (whole seconds, at least
1, as HTTP has it) and retry-after-ms (the precise wait for the next token). `headers=False` leaves all of
them out but Retry-After, for clients that must cope without. Standard library only.
"""

from __future__ import annotations

import math
import threading
import time


class RateLimit:
    """A token bucket over chat requests, with a count of what it accepted and refused."""

    def __init__(self, rate: float, burst: float | None = None, headers: bool = True):
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(1.0, rate))
        self.headers = headers
        self._tokens = self.burst
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self.accepted = 0
        self.refused = 0
        self.first_accepted: float | None = None  # time.time() of the first and last accepted request
        self.last_accepted: float | None = None
        self.refused_at: list[float] = []  # time.time() of each refusal, to see when they came

    def take(self) -> tuple[bool, dict[str, str]]:
        """(accepted, the response headers) for one request arriving now."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
            self._last = now
            accepted = self._tokens >= 1.0
            if accepted:
                self._tokens -= 1.0
                self.accepted += 1
                self.first_accepted = self.first_accepted or time.time()
                self.last_accepted = time.time()
            else:
                self.refused += 1
                self.refused_at.append(time.time())
            tokens = self._tokens
        headers: dict[str, str] = {}
        if self.headers:
            headers = {
                "x-ratelimit-limit-requests": str(int(self.burst)),
                "x-ratelimit-remaining-requests": str(int(tokens)),
                "x-ratelimit-reset-requests": f"{(self.burst - tokens) / self.rate:.3f}s",
            }
        if not accepted:
            wait = (1.0 - tokens) / self.rate
            headers["Retry-After"] = str(max(1, math.ceil(wait)))
            if self.headers:
                headers["retry-after-ms"] = str(max(1, math.ceil(wait * 1000)))
        return accepted, headers

    def stats(self) -> dict:
        with self._lock:
            return {
                "rate": self.rate,
                "burst": self.burst,
                "accepted": self.accepted,
                "refused": self.refused,
                "first_accepted": self.first_accepted,
                "last_accepted": self.last_accepted,
                "refused_at": list(self.refused_at),
            }
