"""(16)-(18): the pacer against endpoints that say little about their rate limit, through the real CLI.

The endpoint is bench/async_endpoint.py with a sliding one-second window of R accepted requests (429 beyond
it, answered at once), as issue 30 measured it. Every other flag at its default, as a new user would run it
(--max_retries 5), the sandbox pinned to local as in (1)-(11).

(16)  a 429 with only `Retry-After` (whole seconds, at least 1): R = 50 and 500 requests a second,
      --concurrency 64 and 256, one-call and three-call prompts (two read_file calls, then the answer).
(16n) the same with a bare 429: no header at all.
(17)  a limit that moves: 200 requests a second, 50 from 10 s to 30 s after the first request, 200 again;
      Retry-After only. Goodput as a share of the limit in force over the run, and how soon after the
      limit's return the accepted rate is back.
(18)  no limit at all: (8)'s --num_workers=32, (9), (10b) and (10) with pacing on and off.
(16f) the first second (issue 38): 400 one-call prompts at R = 50 (0.2 s), Retry-After only, concurrency 64
      and 256: goodput over the whole run, the process's start included: N / R ÷ the CLI's wall time.

Goodput is what the endpoint accepted between its first and last accepted request, per second, so that
start-up and the last replies (the run's tail) are not counted against the pacer.
"""

from __future__ import annotations

import sys

from common import CALLS_PER_PROMPT, DEFAULT_SCRIPT, Server, check_all_done, report, run_cli, write_dataset

ONE_CALL = [{"reasoning": "Nothing to look up.", "content": "Answered: {prompt}"}]
# (R, latency, prompts of one call, prompts of three calls): each run ~20 s at R (issue 30 measured 8 s runs,
# where what the first second costs weighs 2.5 times as much), and --concurrency 64 could send 6.4 R at
# that latency (64 / 0.2 s = 320 calls a second; 64 / 0.02 s = 3,200), so the limit is what binds, even
# with some slots holding a refused call for its Retry-After.
SIZES = {50: (0.2, 1000, 350), 500: (0.02, 10000, 3400)}
CONCURRENCIES = (64, 256)
MOVING = [(0.0, 200.0), (10.0, 50.0), (30.0, 200.0)]


def limited_run(
    name: str, prompts: int, calls: int, rate: float, conc: int, latency: float, headers: str, schedule=None
) -> dict:
    """One CLI run against the windowed endpoint; what the endpoint accepted and refused, and when."""
    extra = ["--rate_limit", str(rate), "--rate_window", "--rate_headers", headers]
    if schedule:
        extra += ["--rate_schedule", ",".join(f"{t:g}:{r:g}" for t, r in schedule)]
    script = ONE_CALL if calls == 1 else DEFAULT_SCRIPT
    with Server(latency=latency, asyncio=True, script=script, extra=tuple(extra)) as srv:
        r = run_cli(name, write_dataset(prompts), srv.base_url, f"--concurrency={conc}", retries=None, codes=(0, 3))
        seen = srv.get("/_rate")
        timings = srv.timings()
    sent = seen["accepted"] + seen["refused"]
    span = seen["last_accepted"] - seen["first_accepted"] if seen["accepted"] > 1 else float("nan")
    return dict(
        r,
        rate=seen,
        timings=timings,
        accepted=seen["accepted"],
        refused=seen["refused"],
        refused_share=seen["refused"] / sent if sent else 0.0,
        goodput=(seen["accepted"] - 1) / span if span == span and span > 0 else 0.0,
        span=span,
        failed=r["samples"]["failed"],
        complete=r["samples"]["done"] == prompts and seen["accepted"] == prompts * calls,
    )


def bench_retry_after_only(results: dict, headers: str = "retry-after") -> None:
    """(16) / (16n): goodput, 429 share and failures over R x concurrency x calls per prompt."""
    key = "16" if headers == "retry-after" else "16n"
    goodput_target = 0.90 if headers == "retry-after" else 0.85
    said = "Retry-After only" if headers == "retry-after" else "a bare 429"
    rows, met = [], True
    for rate, (latency, one, three) in SIZES.items():
        for conc in CONCURRENCIES:
            for calls, prompts in ((1, one), (CALLS_PER_PROMPT, three)):
                name = f"pacing_{key}_{rate}_{conc}_{calls}"
                r = limited_run(name, prompts, calls, rate, conc, latency, headers)
                ok = (
                    r["goodput"] >= goodput_target * rate
                    and r["refused_share"] <= 0.05
                    and r["failed"] == 0
                    and r["complete"]
                )
                met &= ok
                rows.append(dict(r, R=rate, conc=conc, calls=calls, prompts=prompts, latency=latency))
                report(
                    results,
                    f"pacing_{key}",
                    f"({key}) {said}, R = {rate}/s (sliding 1 s window), {prompts} prompts x {calls} call(s) at "
                    f"{latency} s, concurrency {conc}: goodput {r['goodput']:.1f}/s = {r['goodput'] / rate:.1%} of R "
                    f"over {r['span']:.1f} s; {r['refused']} of {r['accepted'] + r['refused']} requests 429 "
                    f"({r['refused_share']:.1%}); {r['failed']} prompts failed; wall {r['wall']:.1f} s "
                    f"[{'met' if ok else 'NOT met'}]",
                )
    results[f"pacing_{key}"] = rows
    report(
        results,
        f"pacing_{key}",
        f"({key}) targets (goodput >= {goodput_target:.0%} of R, 429 <= 5 %, no prompt failing, every run): "
        f"{'met' if met else 'NOT met'}",
    )


def bench_first_second(results: dict, rounds: int = 2, prompts: int = 400, rate: float = 50.0) -> None:
    """(16f) N / R against the whole CLI run, start-up included; where the time beyond N / R went."""
    floor = prompts / rate
    for conc in CONCURRENCIES:
        for i in range(rounds):
            r = limited_run(f"first_second_{conc}_{i}", prompts, 1, rate, conc, 0.2, "retry-after")
            start = r["timings"]["first_request"] - r["started"]
            end = r["ended"] - r["timings"]["last_reply"]
            results.setdefault("first_second", []).append(dict(r, conc=conc))
            share = floor / r["wall"]
            report(
                results,
                "first_second",
                f"(16f) Retry-After only, R = {rate:g}/s, {prompts} one-call prompts at 0.2 s, concurrency {conc}: "
                f"wall {r['wall']:.2f} s against N / R = {floor:.1f} s: goodput {share:.1%} of R over the whole "
                f"run (command to first request {start:.2f} s, first to last accepted {r['span']:.2f} s, last "
                f"reply to exit {end:.2f} s); {r['refused']} requests 429, {r['failed']} failed "
                f"[target >= 90 %: {'met' if share >= 0.90 and not r['failed'] else 'NOT met'}]",
            )


def limit_in_force(schedule, origin: float, start: float, end: float) -> float:
    """Requests the moving limit allowed between `start` and `end` (time.time()): its integral."""
    total = 0.0
    edges = [origin + t for t, _ in schedule] + [float("inf")]
    for (_, rate), a, b in zip(schedule, edges, edges[1:], strict=False):
        lo, hi = max(a, start), min(b, end)
        if hi > lo:
            total += (hi - lo) * rate
    return total


def reopened_after(accepted_at: list[float], at: float, rate: float, share: float = 0.85) -> float | None:
    """Seconds from `at` to the end of the first one-second window after it that accepted `share` of `rate`."""
    times = sorted(t for t in accepted_at if t >= at)
    j = 0
    for i, t in enumerate(times):  # windows ending at each accepted request
        while times[j] < t - 1.0:
            j += 1
        if t - at >= 1.0 and i - j + 1 >= share * rate:
            return t - at
    return None


def bench_moving_limit(results: dict, n: int = 5000, conc: int = 256, latency: float = 0.2) -> None:
    """(17) 200 -> 50 for 20 s -> 200, Retry-After only."""
    r = limited_run("pacing_15", n, 1, MOVING[0][1], conc, latency, "retry-after", schedule=MOVING)
    seen = r["rate"]
    allowed = limit_in_force(MOVING, seen["origin"], seen["first_accepted"], seen["last_accepted"])
    share = (seen["accepted"] - 1) / allowed if allowed else 0.0
    back = reopened_after(seen["accepted_at"], seen["origin"] + MOVING[2][0], MOVING[2][1])
    per_phase = []
    for (t, rate), end in zip(MOVING, [t for t, _ in MOVING[1:]] + [None], strict=False):
        a = seen["origin"] + t
        b = seen["last_accepted"] if end is None else seen["origin"] + end
        count = sum(1 for x in seen["accepted_at"] if a <= x < b)
        per_phase.append(f"{count / max(b - a, 1e-9):.0f}/s of {rate:g}")
    ok = share >= 0.85 and r["failed"] == 0 and r["complete"] and back is not None and back <= 5.0
    results["pacing_15"] = dict(r, share=share, reopened=back)
    report(
        results,
        "pacing_15",
        f"(17) a moving limit (Retry-After only, sliding window) {' -> '.join(f'{r:g}/s at {t:g} s' for t, r in MOVING)}, "
        f"{n} one-call prompts at {latency} s, concurrency {conc}: accepted {seen['accepted']} = {share:.1%} of "
        f"the limit in force over {r['span']:.1f} s (phases: {', '.join(per_phase)}); back to 85 % of "
        f"{MOVING[2][1]:g}/s in the second ending {back if back is None else round(back, 1)} s after its return; "
        f"{r['refused']} requests 429 ({r['refused_share']:.1%}); {r['failed']} prompts failed; "
        f"wall {r['wall']:.1f} s [target >= 85 %, no failure, back within 5 s: {'met' if ok else 'NOT met'}]",
    )


def bench_pacing_cost(results: dict, rounds: int = 2) -> None:
    """(18) what the pacer costs where there is no limit: (8)'s --num_workers=32, (9), (10b) and (10) with
    pacing on and off, through the same entry point, taking turns `rounds` times; the fastest run of each
    counts (load only slows). Beside the wall time, the endpoint's span from the first request to the last
    reply, which the pacer alone can lengthen."""
    from bench_rate_limit import FIXED_CLI, PACED_CLI
    from bench_rate_limit import __file__ as rate_limit_bench
    from bench_scale import TWO_CALLS

    entries = {
        "on": [sys.executable, rate_limit_bench, PACED_CLI],
        "off": [sys.executable, rate_limit_bench, FIXED_CLI],
    }
    rows = (  # (row, prompts, script, latency, jitter, flags)
        ("8", 300, None, 0.5, 0.0, ("--num_workers=32",)),
        ("9", 120, TWO_CALLS, 0.5, 0.0, ("--concurrency=64",)),
        ("10b", 2000, None, 1.0, 0.2, ("--concurrency=256",)),
        ("10", 5000, None, 1.0, 0.2, ("--concurrency=1024",)),
    )
    met = True
    for row, n, script, latency, jitter, flags in rows:
        runs: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for i in range(rounds):
            for label in ("on", "off") if i % 2 == 0 else ("off", "on"):
                with Server(latency=latency, jitter=jitter, asyncio=True, script=script) as srv:
                    r = run_cli(
                        f"pacing_cost_{row}_{label}", write_dataset(n), srv.base_url, *flags, entry=entries[label]
                    )
                    t = srv.timings()
                check_all_done(f"pacing cost {row} {label}", r, n, calls=2 if script else 3)
                runs[label].append((r["wall"], t["last_reply"] - t["first_request"]))
        on, off = min(runs["on"]), min(runs["off"])
        span_on, span_off = min(s for _, s in runs["on"]), min(s for _, s in runs["off"])
        cost, span_cost = on[0] / off[0] - 1, span_on / span_off - 1
        met &= cost <= 0.02
        results.setdefault("pacing_cost", {})[row] = runs
        shown = "; ".join(f"{k}: " + ", ".join(f"{w:.2f} s ({s:.2f})" for w, s in v) for k, v in runs.items())
        report(
            results,
            "pacing_cost",
            f"(18) no limit, ({row}) {n} prompts {' '.join(flags)}: wall with pacing {on[0]:.2f} s, without "
            f"{off[0]:.2f} s: {cost:+.1%}; first request to last reply {span_on:.2f} s against {span_off:.2f} s: "
            f"{span_cost:+.1%} (best of {rounds}; every run, wall (span): {shown}) [target <= +2 %: "
            f"{'met' if cost <= 0.02 else 'NOT met'}]",
        )
    report(results, "pacing_cost", f"(18) targets (every row <= +2 %): {'met' if met else 'NOT met'}")
