"""Pacing of one process's model calls to one endpoint: --concurrency is the ceiling, not the target.

An endpoint is first probed: a few calls, then twice as many every PROBE_DOUBLING seconds until something
answers (TCP's slow start, the window shared out among the worker processes). A refusal is answered quickly
(no tokens are generated for it), so a rate-limited endpoint answers the first call beyond its allowance with
a 429 while the window is still about the allowance's size, not hundreds of calls past it; an endpoint
without limits has the whole --concurrency within a few tenths of a second. The first answer decides:
a success without rate-limit headers opens the ceiling; one with them (OpenAI's x-ratelimit-*), or any 429 or
overload answer (503, 529), paces the calls at a rate.

Paced, a call starts when it takes a permit, and permits are issued at the rate (one thread wakes per
permit). The rate follows AIMD: an answer 429 or overloaded cuts it by BACKOFF (once per round of calls:
a burst of 429s to calls sent together counts once) and stops the permits for the answer's Retry-After;
successes raise it again. Rate-limit headers give the endpoint's rate (requests left and the time to
replenish them): a process starts at its share of it (1 / the number of worker processes), never paces
above all of it, and steers by the requests left, which every process sees alike, so that together they
keep the endpoint's allowance from running dry instead of finding its edge by 429s.

Without headers (a 429 with only Retry-After, or nothing at all: most endpoints) the endpoint's allowance is
measured: the calls this process started in the last second that were not refused are what the endpoint
took in the second it refused one, its ceiling. A 429 sets the rate to CUT of it, once per round of calls;
the rate climbs back to the ceiling within CLIMB seconds, slowing as it nears it (CUBIC's shape), then grows
faster and faster past it, so a ceiling that rose is found within a few seconds, and only while calls are
waiting for the pacer. A lone 429 holds back only its own call, for its Retry-After (the retry loop); the
rest go on at the cut rate. When the endpoint refuses everything (the first 429, or STREAK in a row with
no success between), every call waits for the Retry-After, or BARE_PAUSE when the 429 names no time. A worker's
last samples, their calls about to run out, stay at CUT of the ceiling (last_samples).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from agentbatch.model import numbers
from agentbatch.model.pacing_peers import Peers

# Calls in flight over all processes before the endpoint has answered anything, doubled every PROBE_DOUBLING
# seconds of waiting for that answer; each process takes its share.
PROBE_WINDOW = 8
PROBE_DOUBLING = 0.025
BACKOFF = 0.8  # the rate after a 429, as a share of the rate before
# With headers: the rate changes by GAIN × (share of requests left - TARGET_LEFT) per second (GAIN_DOWN below
# the target), so the processes, all seeing the same count, together keep the endpoint's allowance from
# running dry. The count refills only as fast as the rate falls below the endpoint's, so a steep descent
# overshoots: at 3× GAIN, a run whose probe had used the allowance's burst kept 0.90-0.92 of the endpoint's
# rate (bench (11)); at half of GAIN, 1.07. The 429s, each a cut, stop a descent that is too slow.
GAIN = 1.0
GAIN_DOWN = 0.5
TARGET_LEFT = 0.2
# Without headers: a 429 sets the rate to CUT of the ceiling (what the endpoint took in the last second); the
# rate is back at the ceiling CLIMB seconds of waiting calls later (or CLIMB_CALLS calls), then its growth per
# second grows by EXPLORE every second (×4 within ~3 s more: a limit that rose is found again), until a 429.
CUT = 0.95
PLATEAU = 1.0  # seconds at the ceiling before growing past it: fewer 429s, each a second's wait for its call
# The climb takes CLIMB seconds, or at a low rate the time of CLIMB_CALLS calls (fewer cycles of 429s), at
# most CLIMB_MAX seconds.
CLIMB, CLIMB_CALLS, CLIMB_MAX = 1.0, 20, 3.0
EXPLORE = 1.0
SETTLE = 1.0  # seconds after a cut that a window limit still counts the calls from before it
AFTER_PAUSE = 0.25  # seconds after a pause whose 429s are the endpoint's second before it, not a lower limit
TELL_SECONDS = 0.25  # how often a worker tells the others what it sends (bench (16): the runs' last seconds)
LIFT = 1.2  # accepted in a second over this many times the rate: the ceiling was too low
AHEAD = 2.0  # past the ceiling, the rate stays within this many times the calls started in about the last second
# STREAK 429s in a row (and STREAK_SECONDS of calls at the rate: a worker the CPU held up a moment may read a
# few refusals before the successes of the same moment) and no success for STREAK_SECONDS: the endpoint
# refuses everything, so every call waits.
STREAK, STREAK_SECONDS = 3, 0.25
BARE_PAUSE = 1.0  # that wait when the 429 names none
OWED_MARGIN = 1.0  # seconds past its Retry-After that a refused call is still expected back (a busy CPU, backoff)
MARGIN = 0.02  # seconds after the endpoint's second is over (our clock and its differ by a send)
SLACK = 0.01  # seconds of permits issued together when the issuer wakes late (a busy CPU)
MIN_RATE = 0.5  # calls per second
MAX_RATE = 10_000.0
MAX_PAUSE = 60.0  # the longest Retry-After honoured as a pause of every call (the call itself waits it too)
OVERLOADED = (429, 503, 529)
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class Limits:
    """What x-ratelimit-* headers say: the endpoint's requests per second, its limit, and requests left."""

    rate: float
    limit: float
    remaining: float


_last_samples = threading.Event()  # set in a worker once the run has no task left to hand out (HandedOut)


def last_samples() -> None:
    """This process's samples are the run's last: a pacer whose waiting calls would all start within a second stays
    at CUT of its ceiling, since a call refused then waits its Retry-After while the others finish: the run's end."""
    _last_samples.set()


class Pacer:
    """When each model call of this process may start; shared by the worker's threads."""

    def __init__(self, share: float = 1.0, enabled: bool = True, peers: Peers | None = None):
        self.share = share
        self.enabled = enabled
        self.peers = peers or Peers(None, "")  # the other workers pacing calls to this endpoint
        self.mode = "probe"  # probe, open (no limit seen) or paced
        self.rate: float | None = None
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # the calls waiting for their turn
        self._issuer_cond = threading.Condition(lock)  # the permit issuer, waiting for a permit to be taken
        self._in_flight = 0
        self._waiting = 0  # calls waiting for their turn
        self._probe_start: float | None = None
        self._permits = 0
        self._paused_until = 0.0
        self._last_cut = float("-inf")
        self._last_update = time.monotonic()
        self._ceiling = 0.0  # without headers: what the endpoint took in the second it last refused a call
        self._climb = 0.0  # seconds of calls waiting for the pacer since the last cut
        self._streak = 0  # 429s since the last success
        self._total = 0.0  # without headers: what the endpoint took in a second from all workers, at the last cut
        self._first_refusal: float | None = None  # the first 429's time, until the calls before it are settled
        self._told = float("-inf")  # when this process last told the others what it sends
        self._idle = False  # and whether it had no call left then
        self._telling: float | None = None  # what to tell them once the lock is released
        self._cut_to: float | None = None  # and the ceiling of a cut, to tell them what the endpoint takes
        self._last_success = float("-inf")
        # Start times of the calls of about the last second, of those refused, and of those accepted.
        self._starts: deque[float] = deque(maxlen=16384)
        self._refusals: deque[float] = deque(maxlen=16384)
        self._accepted: deque[float] = deque(maxlen=16384)
        # Refused calls expected back (they sleep their Retry-After outside the pacer, then ask again): until
        # when. A worker whose calls all sleep so is not idle: told so, the others would take its share, and
        # their next cut would take what it sends for what the endpoint takes (a total the lift never passes).
        self._owed: deque[float] = deque(maxlen=16384)
        self._issuer: threading.Thread | None = None

    def acquire(self, deadline: float | None = None) -> float | None:
        """Wait for this call's turn; its start time (the ticket for release), or None if the deadline comes first."""
        if not self.enabled:
            return time.monotonic()
        with self._cond:
            while True:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return None
                wait = self._try_start(now)
                if wait is None:
                    self._in_flight += 1
                    if self._owed:
                        self._owed.popleft()  # a refused call back (or a new one: the worker is busy either way)
                    self._starts.append(now)
                    return now
                if deadline is not None:
                    wait = min(wait, deadline - now)
                self._waiting += 1
                try:
                    self._cond.wait(max(wait, 0.001))
                finally:
                    self._waiting -= 1

    def release(self, ticket: float, status: int, headers: Mapping[str, str] | None) -> None:
        """The call that started at `ticket` ended with this HTTP status (0: no answer) and these headers."""
        if not self.enabled:
            return
        now = time.monotonic()
        with self._cond:
            self._in_flight -= 1
            if status in OVERLOADED:
                self._owed.append(now + (retry_after(headers) or BARE_PAUSE) + OWED_MARGIN)
                limits = _limits(headers)
                if limits:
                    self._back_off(now, ticket, headers, limits)
                else:
                    self._refused(now, ticket, headers)
            elif 200 <= status < 300:
                self._streak, self._last_success = 0, now
                if self.mode == "open":
                    self._accepted.append(ticket)  # what a first 429 will find was accepted before it
                    return  # no limit seen: nothing to adapt (and no headers to read)
                limits = _limits(headers)
                if self.mode == "probe" and limits:
                    self._pace(now, limits)
                elif self.mode == "probe":
                    self.mode = "open"
                    self._accepted.append(ticket)
                else:
                    self._grow(now, ticket, limits)
            elif self.mode == "open":
                return
            if self.mode != "paced":
                self._cond.notify_all()
            telling, self._telling = self._telling, None
            cut_to, self._cut_to = self._cut_to, None
        if telling is not None or cut_to is not None:
            self._exchange(now, telling, cut_to)

    def _exchange(self, now: float, sending: float | None, cut_to: float | None) -> None:
        """What the workers tell each other (files, read and written outside the lock: a busy disk must not
        hold every call back). A cut tells them what the endpoint takes from all of them: this worker's new
        ceiling and what the others send. Now and then each tells what it sends (nothing, as soon as its
        calls are done) and takes up, with calls waiting, its share of what the endpoint takes, or all of it
        once the others are done: a worker whose first 429 came before it had sent much starts far below
        the others, and the last samples of a run drain from some workers first."""
        if sending is not None:
            self.peers.tell_sending(sending, now)
        others = self.peers.others_sending(now)
        if cut_to is not None:
            self.peers.tell_rate(cut_to + others)
        total = self.peers.known_rate() or 0.0
        with self._cond:
            self._total = total
            # What the others do not claim (their share while their calls wait, else what they send).
            room = max(total * self.share, total - others) if self._waiting else 0.0
            if room > LIFT * self._ceiling:
                self._lift(room)

    def _try_start(self, now: float) -> float | None:
        """None if a call may start now (and takes its permit), else how long to wait before asking again."""
        if self.mode == "paced":  # the issuer keeps pauses: waiting calls wake one per permit, not all at once
            if self._permits > 0:
                self._permits -= 1
                self._issuer_cond.notify()
                return None
            return 1.0
        if now < self._paused_until:
            return self._paused_until - now
        if self.mode == "open":
            return None
        if self._probe_start is None:
            self._probe_start = now
            known = self.peers.known_rate()
            if known:  # another worker already found the endpoint's rate: start paced at our share of it
                self._pace(now, Limits(known, 0.0, 0.0))
                return 0.0
        return _probe_wait(self._in_flight, self._waiting, now - self._probe_start, self.share)

    def _issue(self) -> None:
        """The permit issuer of the paced mode: a permit every 1/rate seconds, those of a late wake-up together
        (up to SLACK seconds' worth), and none piling up untaken for a burst later."""
        next_at = time.monotonic()
        with self._issuer_cond:
            while True:
                now = time.monotonic()
                due = max(next_at, self._paused_until)
                if now < due:
                    self._issuer_cond.wait(due - now)
                    continue
                if self._first_refusal is not None:
                    self._settle_first()
                room = max(1, int(self.rate * SLACK)) - self._permits
                if room <= 0:  # not taken yet (no call is waiting)
                    self._issuer_cond.wait(1.0)
                    continue
                issued = min(room, 1 + int((now - due) * self.rate))
                self._permits += issued
                self._cond.notify(issued)
                next_at = max(due + issued / self.rate, now - SLACK)

    def _pace(self, now: float, limits: Limits | None) -> None:
        self.mode = "paced"
        if limits:
            self.rate = _clamp(limits.rate * self.share)
            self._ceiling = self.rate
            self._climb = self._climb_seconds()
            self._total = limits.rate
            self.peers.tell_rate(limits.rate)
        else:  # what the endpoint took in the last second (those still in flight counted in), a little less
            self._ceiling = max(MIN_RATE, self._taken(now))
            self.rate = _clamp(CUT * self._ceiling)
            self._climb = 0.0
            self._first_refusal = now  # once the calls sent before it are answered, what they show is sure
        self._last_update = now
        if self._issuer is None:
            self._issuer = threading.Thread(target=self._issue, name="model-call-pacer", daemon=True)
            self._issuer.start()

    def _back_off(self, now: float, ticket: float, headers, limits: Limits) -> None:
        """A 429 or overload answer that says the endpoint's limits (x-ratelimit-*)."""
        pause = retry_after(headers)
        if pause:
            self._pause(now, pause)
        if self.mode != "paced":
            self._pace(now, limits)
        elif ticket > self._last_cut:  # calls sent before the last cut went at the old pace: they count once
            # The endpoint's rate is known: cuts stop at half this process's share of it.
            self.rate = max(MIN_RATE, limits.rate * self.share / 2, self.rate * BACKOFF)
        else:
            return
        self._last_cut = now
        self._last_update = now
        self._permits = 0

    def _refused(self, now: float, ticket: float, headers) -> None:
        """A 429 or overload answer without rate-limit headers: Retry-After at most, or nothing."""
        if ticket >= self._paused_until:  # a call started during a pause met what came before it
            self._streak += 1
        self._refusals.append(ticket)
        first = self.mode != "paced"
        if first:
            self._pace(now, None)
            cut = True
        elif ticket > self._last_cut and not self._paused_until <= ticket < self._paused_until + AFTER_PAUSE:
            # (sent before the last cut, at the old pace: they count once; AFTER_PAUSE: a burst that came late)
            # A window limit remembers the second before the cut: calls soon after it may still be refused,
            # a cut again only if the endpoint now takes less than the cut rate (the limit went down).
            taken = self._taken(now)
            cut = ticket > self._last_cut + SETTLE or taken < self.rate
            if cut:
                self._ceiling = max(MIN_RATE, min(self.rate, taken))
                self._cut_to = self._ceiling
                self.rate = _clamp(CUT * self._ceiling)
                self._climb = 0.0
        else:
            cut = False
        if cut:
            self._last_cut = self._last_update = now
            self._permits = 0
            self._issuer_cond.notify()
        quiet = now - max(self._last_success, self._paused_until)  # no success, though calls were sent
        streak = self._streak >= max(STREAK, STREAK_SECONDS * self.rate)  # a quarter second of calls at least
        if first or (streak and quiet >= STREAK_SECONDS):  # the endpoint refuses everything
            pause = retry_after(headers)
            pause = BARE_PAUSE if pause is None else pause
            if first and self._sent(now):
                # The calls before the first 429 went out at once and used up the endpoint's second: it is
                # over (a window, or a bucket refilled) a second after the first of them, often sooner than
                # a Retry-After in whole seconds says. The refused calls themselves still wait for it.
                pause = min(pause, self._starts[0] + 1.0 + MARGIN - now)
            self._pause(now, pause)

    def _pause(self, now: float, seconds: float) -> None:
        """No call starts for `seconds` (at most MAX_PAUSE): the permits issued are void."""
        self._paused_until = max(self._paused_until, now + min(seconds, MAX_PAUSE))
        self._permits = 0

    def _grow(self, now: float, ticket: float, limits: Limits | None) -> None:
        dt = now - max(self._last_update, min(self._paused_until, now))  # a pause is no time at the rate
        self._last_update = now
        if limits:
            offset = limits.remaining / limits.limit - TARGET_LEFT
            change = (GAIN if offset > 0 else GAIN_DOWN) * offset * dt
            rate = self.rate * max(0.5, 1 + change)
            # never above the whole endpoint's rate
            self.rate = min(_clamp(rate), max(MIN_RATE, limits.rate))
            return
        if self._waiting:  # the pacer holds calls back: time to find out whether the endpoint takes more
            self._climb += dt
        # The calls accepted that started within a second before this one: the endpoint takes at least that
        # many a second. Clearly more than the rate (a burst before the first 429, whose answer came while
        # calls of the same second were still being sent) lifts the ceiling to it.
        self._accepted.append(ticket)
        while self._accepted and self._accepted[0] < ticket - 1.0:
            self._accepted.popleft()
        if len(self._accepted) > max(self._ceiling, LIFT * self.rate + 1):
            self._lift(len(self._accepted))
        while self._owed and self._owed[0] < now:
            self._owed.popleft()  # a refused call that did not come back (its retries were over)
        idle = not self._waiting and not self._in_flight and not self._owed
        settled = self._first_refusal is None  # (before, what it sent was the burst before its first 429)
        if self.peers.directory and settled and (now - self._told >= TELL_SECONDS or idle != self._idle):
            self._told, self._idle = now, idle
            # What it sends at its pace, or its share of the endpoint while its calls wait for more: what it
            # claims of the limit. Told by release(), outside the lock.
            sending = min(self.rate, float(self._sent(now)))
            self._telling = 0.0 if idle else max(sending, self._total * self.share) if self._waiting else sending
        rate = self._ceiling * _climbed(self._climb, self._climb_seconds())
        if _last_samples.is_set() and self._waiting < self.rate:  # (the calls left all go within a second)
            rate = min(rate, CUT * self._ceiling)
        elif rate > self._ceiling:  # past the ceiling, never far ahead of what is really sent (a busy CPU lags)
            rate = min(rate, max(self._ceiling, AHEAD * self._sent(now)))
        self.rate = _clamp(rate)

    def _lift(self, ceiling: float) -> None:
        """A higher ceiling, the rate kept where it is (at least CUT of the new ceiling)."""
        share = self.rate / ceiling
        self._ceiling = ceiling
        if share > 1.0:  # where on the growth past the ceiling the rate already is
            self._climb = self._climb_seconds() + PLATEAU + math.sqrt(2 * math.log(share) / EXPLORE)
        elif share > CUT:  # where on the climb back to it
            self._climb = self._climb_seconds() * (1 - ((1 - share) / (1 - CUT)) ** (1 / 3))
        else:
            self._climb = 0.0

    def _settle_first(self) -> None:
        """The first pause is over, and every call sent before the first 429 answered: those accepted within
        the second before it are the ceiling (the calls in flight then, counted as taken, may have been refused)."""
        since, until = self._first_refusal - 1.0, self._first_refusal
        self._first_refusal = None
        burst = sum(1 for t in self._accepted if since <= t <= until)
        if burst:
            self._ceiling = burst
            self.rate = _clamp(CUT * burst)
            self._climb = 0.0

    def _climb_seconds(self) -> float:
        return max(CLIMB, min(CLIMB_MAX, CLIMB_CALLS / self._ceiling)) if self._ceiling > 0 else CLIMB

    def _sent(self, now: float) -> int:
        """Calls started in the last second."""
        while self._starts and self._starts[0] < now - 1.0:
            self._starts.popleft()
        return len(self._starts)

    def _taken(self, now: float) -> int:
        """Calls started in the last second that were not refused: what the endpoint took in it."""
        while self._refusals and self._refusals[0] < now - 1.0:
            self._refusals.popleft()
        return max(0, self._sent(now) - len(self._refusals))


def _climbed(t: float, climb: float) -> float:
    """The rate `t` seconds of waiting calls after a cut, as a share of the ceiling: CUBIC's concave climb back
    to it within `climb` seconds, PLATEAU seconds at it, then a growth that itself grows by EXPLORE a second."""
    if t < climb:
        return 1.0 - (1.0 - CUT) * (1.0 - t / climb) ** 3
    return math.exp(min(EXPLORE * max(0.0, t - climb - PLATEAU) ** 2 / 2, 20.0))


def _clamp(rate: float) -> float:
    return min(MAX_RATE, max(MIN_RATE, rate))


def _probe_wait(in_flight: int, waiting: int, elapsed: float, share: float) -> float | None:
    """None if one more call fits the probe's window `elapsed` seconds in, else how long this one should wait.

    A call that must wait sleeps until the window has room for it behind the calls already waiting, so each
    of hundreds of waiting threads wakes about once instead of all of them at every widening.
    """
    base = PROBE_WINDOW * share
    # Capped: an endpoint whose first answer takes over 25 s would make 2 ** (elapsed / 0.025) overflow a float.
    if in_flight < max(1.0, base * 2 ** min(elapsed / PROBE_DOUBLING, 64)):
        return None
    # The window holds n calls once base * 2 ** (t / PROBE_DOUBLING) reaches n.
    return max(0.001, PROBE_DOUBLING * math.log2((in_flight + waiting + 1) / base) - elapsed)


def _limits(headers: Mapping[str, str] | None) -> Limits | None:
    """The endpoint's limits from x-ratelimit-* headers, or None.

    A token bucket that allows `limit` requests and has `remaining` left refills in `reset`, so it
    replenishes (limit - remaining) / reset requests a second (OpenAI: 5000 a minute, 4999 left, reset 12ms).
    """
    if not headers:
        return None
    try:
        limit = float(headers.get("x-ratelimit-limit-requests") or "nan")
        remaining = float(headers.get("x-ratelimit-remaining-requests") or "nan")
    except ValueError:
        return None
    reset = _seconds(headers.get("x-ratelimit-reset-requests"))
    if not (limit > 0 and 0 <= remaining < limit) or not reset:
        return None
    return Limits((limit - remaining) / reset, limit, remaining)


def _seconds(value: str | None) -> float | None:
    """A reset time as OpenAI writes it ("12ms", "1.5s", "6m0s") or as plain seconds."""
    if not value:
        return None
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait: retry-after-ms, or Retry-After as seconds or an HTTP date.

    Finite, 0 to numbers.MAX_WAIT_SECONDS; None when there is none or it is not a number ("nan", "²").
    """
    if not headers:
        return None
    if headers.get("retry-after-ms") is not None:
        return numbers.seconds(headers["retry-after-ms"], unit=0.001)
    value = headers.get("retry-after")
    if value is None:
        return None
    wait = numbers.seconds(value)
    if wait is not None or not isinstance(value, str):
        return wait
    import email.utils  # an HTTP date: rare, and ~7 ms of start-up to import

    try:
        when = email.utils.parsedate_to_datetime(value)
        left = (when - datetime.now(when.tzinfo or UTC)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(left, 0.0), numbers.MAX_WAIT_SECONDS)
