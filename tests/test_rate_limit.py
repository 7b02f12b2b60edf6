"""Adaptive concurrency: the scripted server's rate-limited mode, the pacer, and a rate-limited run through the CLI."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from scripted_rate_limit import RateLimit
from scripted_server import ScriptedServer

from agentbatch.model import rate_limit
from agentbatch.model.base import ModelCallError
from agentbatch.model.client import ModelClient, ModelSettings
from agentbatch.model.pacing_peers import Peers
from agentbatch.model.rate_limit import (
    AFTER_PAUSE,
    CLIMB,
    CUT,
    PLATEAU,
    PROBE_DOUBLING,
    PROBE_WINDOW,
    STREAK,
    Pacer,
    _limits,
    _seconds,
    retry_after,
)

ONE_CALL = [{"content": "answered"}]


def post(srv: ScriptedServer) -> tuple[int, dict]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(srv.base_url + "/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_the_rate_limited_server_accepts_its_burst_then_answers_429_with_openai_headers():
    with ScriptedServer(default_script=ONE_CALL, rate_limit=2, rate_burst=3) as srv:
        answers = [post(srv) for _ in range(5)]
        stats = srv.rate_limit.stats()
    assert [status for status, _ in answers[:3]] == [200, 200, 200]
    assert 429 in [status for status, _ in answers[3:]]
    status, headers = next(a for a in answers if a[0] == 429)
    assert headers["x-ratelimit-limit-requests"] == "3" and headers["x-ratelimit-remaining-requests"] == "0"
    assert int(headers["Retry-After"]) >= 1 and 0 < int(headers["retry-after-ms"]) <= 500
    assert stats["accepted"] + stats["refused"] == 5 and stats["refused"] >= 1
    limits = _limits({k.lower(): v for k, v in headers.items()})
    assert limits is not None and limits.rate == pytest.approx(2.0, rel=0.2)  # the bucket's rate, from headers


def test_the_window_limit_counts_a_sliding_second_says_as_little_as_asked_and_moves_on_schedule():
    said = RateLimit(3, headers=False, window=True)
    assert [said.take() for _ in range(4)][2:] == [(True, {}), (False, {"Retry-After": "1"})]
    bare = RateLimit(3, headers=False, window=True, retry_after=False)
    assert [bare.take() for _ in range(4)][3] == (False, {})
    moving = RateLimit(10, window=True, schedule=[(0, 10), (2, 3), (5, 10)])
    assert [moving.rate_at(t) for t in (0.5, 2.5, 4.9, 9)] == [10, 3, 3, 10]


def test_header_values_as_endpoints_write_them():
    assert _seconds("12ms") == pytest.approx(0.012) and _seconds("6m0s") == 360 and _seconds("1.5s") == 1.5
    assert _seconds("0.25") == 0.25 and _seconds("soon") is None and _seconds("") is None
    openai = {"x-ratelimit-limit-requests": "5000", "x-ratelimit-remaining-requests": "4999"}
    assert _limits({**openai, "x-ratelimit-reset-requests": "12ms"}).rate == pytest.approx(1 / 0.012)
    assert _limits({**openai, "x-ratelimit-remaining-requests": "5000", "x-ratelimit-reset-requests": "0s"}) is None
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after({"retry-after": "3"}) == 3 and retry_after({}) is None


def test_the_pacer_opens_for_an_endpoint_without_limits_and_paces_after_a_429():
    open_one = Pacer()
    ticket = open_one.acquire()
    open_one.release(ticket, 200, {})
    assert open_one.mode == "open"
    tickets = [open_one.acquire() for _ in range(300)]  # no window any more: none waits
    assert all(t is not None for t in tickets)

    pacer = Pacer()
    first = pacer.acquire()
    pacer.release(first, 429, {"retry-after-ms": "10"})
    assert pacer.mode == "paced" and pacer.rate is not None
    pacer.rate = 20.0
    start = time.monotonic()
    for _ in range(6):
        pacer.release(pacer.acquire(), 200, {})
    # Six starts at 20 a second are at least five intervals apart (a loaded machine only makes it slower).
    assert time.monotonic() - start >= 5 / 20 * 0.9


def test_the_probe_doubles_its_window_until_the_endpoint_answers():
    """Nothing answered yet: the k-th call starts no sooner than the window has room for it (8, then twice as
    many every PROBE_DOUBLING seconds), and 256 calls are all under way within a few doublings more."""
    pacer = Pacer()
    starts: list[float] = []
    lock = threading.Lock()

    def call() -> None:
        ticket = pacer.acquire(deadline=time.monotonic() + 30)
        with lock:
            starts.append(ticket)

    threads = [threading.Thread(target=call) for _ in range(256)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(starts) == 256 and None not in starts and pacer.mode == "probe"
    starts.sort()
    origin = pacer._probe_start
    for k, started in enumerate(starts):  # call k (from 0) starts once the window is over k
        allowed = PROBE_DOUBLING * max(0.0, math.log2(max(k, 1) / PROBE_WINDOW))
        assert started - origin >= allowed - 0.002, (k, started - origin, allowed)
    # 256 = 8 * 2 ** 5: five doublings; a loaded machine may add some, not seconds of them.
    assert starts[-1] - origin < 5 * PROBE_DOUBLING + 2.0


def test_429s_to_calls_sent_before_a_cut_count_once():
    pacer = Pacer()
    tickets = [pacer.acquire() for _ in range(PROBE_WINDOW)]  # the probe's first window, all under way
    pacer.release(tickets[0], 429, {"retry-after-ms": "1"})
    # The endpoint took the other calls of that second (in flight): the rate is CUT of them.
    assert pacer.mode == "paced" and pacer.rate == pytest.approx(CUT * (PROBE_WINDOW - 1))
    rate = pacer.rate
    for t in tickets[1:]:  # sent before the cut, refused as well: they change nothing
        pacer.release(t, 429, {"retry-after-ms": "1"})
    assert pacer.rate == rate


def paced_after_first_window() -> Pacer:
    """A pacer whose first window of calls met one 429 (without rate-limit headers) and the rest accepted."""
    pacer = Pacer()
    tickets = [pacer.acquire() for _ in range(PROBE_WINDOW)]
    pacer.release(tickets[0], 429, {})
    for t in tickets[1:]:
        pacer.release(t, 200, {})
    return pacer


def accepted_calls(pacer: Pacer, stop: float, threads: int = 16) -> None:
    """More calls than the rate lets through, all accepted, from `threads` threads until `stop`."""

    def calls() -> None:
        while time.monotonic() < stop:
            ticket = pacer.acquire(deadline=stop)
            if ticket is not None:
                pacer.release(ticket, 200, {})

    callers = [threading.Thread(target=calls) for _ in range(threads)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=60)


def burst_then_paced(pacer: Pacer, calls: int = PROBE_WINDOW) -> None:
    """The probe's first `calls` all under way, the first refused (Retry-After: 1) and the others accepted: the
    pacer pauses every call until the endpoint's second is over, then paces at CUT of the burst."""
    tickets = [pacer.acquire() for _ in range(calls)]  # (past the first window, as the probe doubles it)
    pacer.release(tickets[0], 429, {"retry-after": "1"})
    for t in tickets[1:]:
        pacer.release(t, 200, {})


def test_a_429_just_after_the_first_pause_is_not_a_lower_limit():
    pacer = Pacer()
    burst_then_paced(pacer)
    ticket = pacer.acquire(deadline=time.monotonic() + 10)  # the first call after the pause
    assert ticket is not None
    rate = pacer.rate
    assert rate == pytest.approx(CUT * (PROBE_WINDOW - 1))
    # The burst reached the endpoint a little late, so its second is not quite over there: refused. Counted over
    # the last second, which the pause kept empty, the endpoint would seem to take nothing: the rate fell to its
    # floor of 0.5 a second, and stayed far below the limit for seconds.
    pacer.release(ticket, 429, {"retry-after": "1"})
    assert pacer.rate == rate
    # A limit that really is lower still shows: refused a moment later, a call cuts the rate.
    time.sleep(AFTER_PAUSE)
    ticket = pacer.acquire(deadline=time.monotonic() + 10)
    pacer.release(ticket, 429, {"retry-after": "1"})
    assert pacer.rate < rate


def test_a_worker_told_its_samples_are_the_last_stays_below_its_ceiling(monkeypatch):
    """Calls wait for the pacer past the climb and the plateau, when it would grow past the ceiling: told the
    samples are the last, it stays at CUT of the ceiling instead."""
    rates = {}
    for told in (False, True):
        monkeypatch.setattr(rate_limit, "_last_samples", threading.Event())
        if told:
            rate_limit.last_samples()
        pacer = Pacer()
        ceiling = 4 * PROBE_WINDOW - 1  # (CLIMB_CALLS calls take less than CLIMB at that rate)
        burst_then_paced(pacer, ceiling + 1)
        stop = time.monotonic() + 1.0 + CLIMB + PLATEAU + 1.0  # the pause, the climb, the plateau, then growth

        accepted_calls(pacer, stop)
        rates[told] = pacer.rate / ceiling
    assert rates[False] > 1.05, rates  # grown past the ceiling, to find a limit that went up
    assert rates[True] == pytest.approx(CUT), rates


def test_a_lone_429_holds_back_its_own_call_only_and_a_streak_holds_back_every_call():
    pacer = paced_after_first_window()
    time.sleep(0.05)
    ticket = pacer.acquire(deadline=time.monotonic() + 10)
    pacer.release(ticket, 429, {"retry-after": "30"})  # one 429 among successes: the others go on
    ticket = pacer.acquire(deadline=time.monotonic() + 10)
    assert ticket is not None
    pacer.release(ticket, 200, {})
    tickets = [pacer.acquire(deadline=time.monotonic() + 10) for _ in range(STREAK)]
    for t in tickets:  # the endpoint refuses everything: every call waits its Retry-After
        pacer.release(t, 429, {"retry-after": "30"})
    assert pacer.acquire(deadline=time.monotonic() + 0.3) is None


def test_the_rate_grows_only_while_calls_wait_for_it():
    pacer = paced_after_first_window()
    rate = pacer.rate
    time.sleep(CLIMB + 0.2)  # no call waited: the pacer has learnt nothing about a higher rate
    pacer.release(pacer.acquire(deadline=time.monotonic() + 10), 200, {})
    assert pacer.rate == pytest.approx(rate)
    stop = time.monotonic() + 2 * CLIMB + 0.5

    accepted_calls(pacer, stop)
    assert pacer.rate > rate * 1.02  # on its way back to the ceiling it was cut from


def test_retry_after_pauses_every_call_and_the_deadline_is_honoured():
    pacer = Pacer()
    pacer.release(pacer.acquire(), 429, {"retry-after": "30"})
    assert pacer.acquire(deadline=time.monotonic() + 0.2) is None  # paused for 30 s: the deadline comes first
    waiting = []
    thread = threading.Thread(target=lambda: waiting.append(pacer.acquire(deadline=time.monotonic() + 0.3)))
    thread.start()
    thread.join(timeout=30)
    assert waiting == [None]


def rate_limited_run(tmp_path, headers: bool, *flags: str):
    prompts = [f"rate limited prompt {i}" for i in range(120)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    args = ["--dataset_file=ds.jsonl", "--run_name=rl", "--batch_size=50", "--distribution=terminal_only"]
    args += ["--require_reasoning=false", "--num_workers=2", "--concurrency=64", "--max_retries=2", *flags]
    with ScriptedServer(default_script=ONE_CALL, latency=0.1, rate_limit=20, rate_headers=headers) as srv:
        proc = run_cli(args, tmp_path, srv)
        stats = srv.rate_limit.stats()
    return proc, RunDir(tmp_path / "data" / "rl"), stats


@pytest.mark.parametrize("headers", [True, False], ids=["x-ratelimit headers", "Retry-After only"])
def test_a_rate_limited_endpoint_fails_no_prompt_and_mostly_sees_accepted_requests(tmp_path, headers):
    # 64 prompts at once against 20 requests a second and only 3 attempts a call: sent all at once, as the
    # runner did before, many prompts fail; paced, none does.
    proc, run, stats = rate_limited_run(tmp_path, headers)
    assert_clean_exit(proc, 0)
    assert run.stats()["prompts"]["done"] == 120 and not run.failed()
    sent = stats["accepted"] + stats["refused"]
    assert stats["accepted"] == 120
    assert stats["refused"] / sent < 0.3, f"{stats['refused']} of {sent} requests answered 429"


def drive(srv: ScriptedServer, threads: int, seconds: float) -> list[Exception]:
    """`threads` callers through one ModelClient for `seconds` (as a worker's slots do); the calls that failed."""
    client = ModelClient(ModelSettings(model="m", base_url=srv.base_url, api_key="k", max_retries=5))
    stop = time.monotonic() + seconds
    failed: list[Exception] = []

    def calls(i: int) -> None:
        while time.monotonic() < stop:
            try:
                client.chat([{"role": "user", "content": f"prompt {i}"}])
            except ModelCallError as e:
                failed.append(e)

    callers = [threading.Thread(target=calls, args=(i,)) for i in range(threads)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    return failed


def per_second(times: list[float], start: float, end: float) -> float:
    return sum(1 for t in times if start <= t < end) / (end - start)


@pytest.mark.parametrize("retry_after_header", [True, False], ids=["Retry-After only", "a bare 429"])
def test_the_pacer_converges_under_a_window_limit_that_says_nothing_else(retry_after_header):
    """R requests in any one second, 429 beyond: the accepted rate settles near R with few 429s, and a
    429 no longer stops every call for its Retry-After (that alone cost a second in every few)."""
    rate = 40
    with ScriptedServer(default_script=ONE_CALL, latency=0.05) as srv:
        srv.rate_limit = RateLimit(rate, headers=False, window=True, retry_after=retry_after_header)
        failed = drive(srv, threads=24, seconds=10)
        seen = srv.rate_limit.stats()
    assert not failed
    settled = (seen["origin"] + 3, seen["origin"] + 9.5)  # after the first seconds, before the callers stop
    accepted = per_second(seen["accepted_at"], *settled)
    refused = per_second(seen["refused_at"], *settled)
    assert accepted >= 0.8 * rate, f"{accepted:.1f} accepted a second against a limit of {rate}"
    assert refused <= 0.1 * (accepted + refused), f"{refused:.1f} refused a second, {accepted:.1f} accepted"


def test_the_pacer_follows_a_limit_that_moves_down_and_back_up():
    rate, low = 60, 15
    with ScriptedServer(default_script=ONE_CALL, latency=0.05) as srv:
        srv.rate_limit = RateLimit(rate, headers=False, window=True, schedule=[(0, rate), (4, low), (9, rate)])
        failed = drive(srv, threads=24, seconds=14)
        seen = srv.rate_limit.stats()
    assert not failed
    origin = seen["origin"]
    # Down: after a second or two at the lower limit, most requests are accepted again.
    accepted = per_second(seen["accepted_at"], origin + 6, origin + 9)
    refused = per_second(seen["refused_at"], origin + 6, origin + 9)
    assert refused <= 0.25 * (accepted + refused), f"{refused:.1f} refused a second, {accepted:.1f} accepted"
    # Back up: within a few seconds of the limit's return the pacer sends at most of it again.
    back = per_second(seen["accepted_at"], origin + 12, origin + 14)
    assert back >= 0.7 * rate, f"{back:.1f} accepted a second, 3 s after the limit went back to {rate}"


def test_a_worker_takes_up_what_an_idle_one_leaves_of_the_limit(tmp_path):
    """Two workers share a window limit; when one runs out of calls (its last prompts done), the other,
    whose calls still wait, soon lets its calls go at most of the limit instead of its half.

    What is measured is the pace the worker's pacer allows, sampled every 20 ms, not the calls its threads
    got accepted: on a machine the rest of the suite keeps busy, threads late for their turn and cuts that
    count a starved second's calls lower that, and that is not what this test is about (the accepted rate
    is bench (16)'s)."""
    rate = 40
    limit = RateLimit(rate, headers=False, window=True)
    workers = {w: Pacer(share=0.5, peers=Peers(str(tmp_path), "endpoint", me=w)) for w in "ab"}
    start = time.monotonic()
    stops = {"a": start + 11, "b": start + 6}
    paces: list[tuple[float, float]] = []  # (when, the pace a's pacer allows)

    def calls(w: str) -> None:
        pacer = workers[w]
        while time.monotonic() < stops[w]:  # a worker's last calls still go, as its last prompts finish
            while True:  # a refused call sleeps its Retry-After and goes again, as the client's do
                ticket = pacer.acquire(deadline=stops[w] + 30)
                ok, headers = limit.take()
                if ok:
                    time.sleep(0.02)
                pacer.release(ticket, 200 if ok else 429, {k.lower(): v for k, v in headers.items()})
                if ok:
                    break
                time.sleep(retry_after({k.lower(): v for k, v in headers.items()}) or 1.0)

    def watch() -> None:
        while (now := time.monotonic()) < stops["a"]:
            paces.append((now, workers["a"].rate or 0.0))
            time.sleep(0.02)

    threads = [threading.Thread(target=calls, args=(w,)) for w in "ab" for _ in range(12)]
    threads.append(threading.Thread(target=watch))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    after = [(at - stops["b"], pace) for at, pace in paces if at >= stops["b"]]
    # b's last calls, waiting for their turn, still go for a moment; then a is told b sends nothing.
    reached = next((at for at, pace in after if pace >= 0.9 * rate), None)
    assert reached is not None and reached <= 2.0, f"a's pace after b ran out of calls: {after[::25]}"
    # On its own it would find the limit again too, by growing past its ceiling: some seconds later.
    held = sorted(pace for at, pace in after if 1.0 <= at < 3.0)
    assert held[len(held) // 2] >= 0.8 * rate, f"a's pace 1-3 s after b ran out of calls: {held[::10]}"


def test_a_worker_whose_refused_calls_wait_to_go_again_is_not_idle(tmp_path):
    """A refused call sleeps its Retry-After outside the pacer: until it asks again its worker still has calls,
    and the others must not hear it sends nothing (they would take its share, and their next cut would count
    the endpoint's rate without it); once its last call is done, they hear it at once."""
    b = Pacer(share=0.5, peers=Peers(str(tmp_path), "endpoint", me="b"))
    a = Peers(str(tmp_path), "endpoint", me="a")
    b.release(b.acquire(), 200, {})  # no limit seen yet
    b.release(b.acquire(), 429, {"retry-after": "0"})  # paced from now on
    refused, accepted = b.acquire(deadline=time.monotonic() + 5), b.acquire(deadline=time.monotonic() + 5)
    assert refused is not None and accepted is not None
    b.release(refused, 429, {"retry-after": "0"})
    b.release(accepted, 200, {})  # nothing waits or is in flight, but the refused call comes back
    assert a.others_sending(time.monotonic()) > 0
    again = b.acquire(deadline=time.monotonic() + 5)
    assert again is not None
    b.release(again, 200, {})
    assert a.others_sending(time.monotonic()) == 0


class RecordedWindow(RateLimit):
    """A window limit that notes, per server connection (one per client thread), when each request came and
    the Retry-After a refusal gave."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: dict[int, list[tuple[float, float | None]]] = {}

    def take(self):
        accepted, headers = super().take()
        wait = None if accepted else float(headers.get("Retry-After", 0))
        self.seen.setdefault(threading.get_ident(), []).append((time.monotonic(), wait))
        return accepted, headers


def test_a_refused_call_never_starts_again_before_its_retry_after():
    """The pacer may let other calls go sooner, but a refused call waits for the time its 429 gave."""
    with ScriptedServer(default_script=ONE_CALL, latency=0.05) as srv:
        srv.rate_limit = RecordedWindow(30, headers=False, window=True)
        failed = drive(srv, threads=16, seconds=6)
        seen = srv.rate_limit.seen
    assert not failed
    refusals = 0
    for requests in seen.values():  # one connection: one thread's calls, each retry right after its 429
        for (at, wait), (then, _) in zip(requests, requests[1:], strict=False):
            if wait is not None:
                refusals += 1
                assert then - at >= wait - 0.01, f"called again {then - at:.3f} s after a 429 that said {wait:g} s"
    assert refusals >= 1  # the run met the limit, so the rule was exercised


def test_a_probe_whose_first_answer_is_slow_keeps_admitting_calls():
    # The embedded model's first answer can take minutes on a loaded machine: the window then is wide open,
    # not a float overflow that failed every waiting call as an internal error.
    from agentbatch.model.rate_limit import _probe_wait

    for elapsed in (30.0, 600.0, 1e6):
        assert _probe_wait(in_flight=500, waiting=10, elapsed=elapsed, share=1.0) is None
