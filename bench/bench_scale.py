"""(8)-(10): fast at every size, through the real CLI against bench/async_endpoint.py.

(8)  --num_workers=32 against every layout of 32 slots (processes × threads), 300 prompts × 3 calls at 0.5 s.
(9)  fixed overhead at 120 prompts × 2 calls at 0.5 s, --concurrency=64: process start to the first request
     at the endpoint, plus the last reply to the process's exit; and where that time goes, phase by phase.
(10)  1,024 samples in flight: 5,000 prompts × 3 calls at 1 s ± 20 %, --concurrency=1024; (10b) 2,000 × 3 at 256.
     Beside each: the same requests from bench/bare_client.py (nothing but HTTP) and the schedule's own floor.
     (10) is judged against the bare client measured in the same bench run (issue 19's note, issue 30: no
     client reaches N·L/C × 1.10 here), (10b) against N·L/C.

The layouts of (8) and the phase marks of (9) come from bench/cli_variants.py, the CLI with one thing changed.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from common import GIB, MIB, OUT, READ_PATH, Server, check_all_done, report, run_cli, write_dataset

VARIANTS = str(Path(__file__).with_name("cli_variants.py"))
TWO_CALLS = [
    {"reasoning": "Let me look at the file.", "tool_calls": [{"name": "read_file", "arguments": {"path": READ_PATH}}]},
    {"reasoning": "I have what I need.", "content": "Done with: {prompt}"},
]


def bench_layouts(results: dict, n: int = 300, slots: int = 32, latency: float = 0.5, rounds: int = 2) -> None:
    """(8) the documented way to ask for 32 slots (samples in flight) against each way of laying them out.

    Each layout runs `rounds` times, interleaved with the others, and its fastest run counts: on a shared
    machine a run is only ever slowed by the others' load.
    """
    dataset = write_dataset(n)
    ideal = n * 3 * latency / slots
    layouts = {"--num_workers=32": None, **{f"{p} x {-(-slots // p)}": p for p in (1, 2, 4, 32)}}
    runs: dict[str, list[dict]] = {k: [] for k in layouts}
    with Server(latency=latency, asyncio=True) as srv:
        for round_ in range(rounds):
            order = list(layouts) if round_ % 2 == 0 else list(reversed(layouts))
            for name in order:
                processes = layouts[name]
                entry = None if processes is None else [sys.executable, VARIANTS, "layout", str(processes)]
                r = run_cli(f"layout_{processes}", dataset, srv.base_url, f"--num_workers={slots}", entry=entry)
                check_all_done(name, r, n)
                runs[name].append(r)
    best = {k: min(v, key=lambda r: r["wall"]) for k, v in runs.items()}
    fastest = min(best, key=lambda k: best[k]["wall"])
    ratio = best["--num_workers=32"]["wall"] / best[fastest]["wall"]
    results["layouts"] = {"ideal": ideal, "runs": runs, "fastest": fastest, "ratio": ratio}
    shown = "; ".join(
        f"{k}: {r['wall']:.2f} s ({r['wall'] / ideal:.3f} of ideal, {r['peak_rss'] / MIB:.0f} MiB, "
        f"load {r['loadavg'][0]:.1f})"
        for k, r in best.items()
    )
    report(
        results,
        "layouts",
        f"(8) 32 slots, {n} prompts x 3 calls at {latency} s (ideal {ideal:.2f} s), best of {rounds}: {shown}; "
        f"--num_workers=32 / fastest ({fastest}) = {ratio:.3f} [target <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'}]",
    )


def bench_overhead(results: dict, n: int = 120, conc: int = 64, latency: float = 0.5, repeats: int = 3) -> None:
    """(9) start to first request plus last reply to exit, and the phases of one more run."""
    dataset = write_dataset(n)
    ideal = n * 2 * latency / conc
    lines = []
    figures = []
    for i in range(repeats + 1):
        phases = OUT / "phases.json"
        phases.unlink(missing_ok=True)
        entry = [sys.executable, VARIANTS, "phases", str(phases)] if i == repeats else None
        with Server(latency=latency, asyncio=True, script=TWO_CALLS) as srv:
            r = run_cli(f"overhead_{i}", dataset, srv.base_url, f"--concurrency={conc}", entry=entry)
            t = srv.timings()
        check_all_done(f"overhead_{i}", r, n, calls=2)
        start, end = t["first_request"] - r["started"], r["ended"] - t["last_reply"]
        if i < repeats:
            figures.append((start + end, start, end, r["wall"], os.getloadavg()[0]))
            continue
        marks = json.loads(phases.read_text())
        marks.update(first_request=t["first_request"], last_reply=t["last_reply"], exited=r["ended"])
        lines.append(_phases(marks, r["started"]))
    interpreter = _bare_interpreter()
    results["overhead"] = {"ideal": ideal, "runs": figures, "interpreter": interpreter}
    best = min(f[0] for f in figures)
    shown = "; ".join(
        f"{o:.3f} s = {s:.3f} start + {e:.3f} end, wall {w:.2f} s = {w / ideal:.2f} of ideal (load {la:.1f})"
        for o, s, e, w, la in figures
    )
    report(
        results,
        "overhead",
        f"(9) fixed overhead, {n} prompts x 2 calls at {latency} s, concurrency {conc} (ideal {ideal:.2f} s): "
        f"{shown} [target <= 0.3 s: {'met' if best <= 0.3 else 'NOT met'}]",
    )
    report(
        results,
        "overhead_phases",
        f"(9) where it goes (one more run, with marks): {lines[0]}; a bare `python -c pass` takes {interpreter:.3f} s",
    )


def _phases(marks: dict, started: float) -> str:
    order = [
        ("interpreter and site", "main"),
        ("imports", "imported"),
        ("flags, dataset, settings", "executor"),
        ("workers started", "executor_made"),
        ("session set-up (resume scan, tool check)", "handing_out"),
        ("to the first request", "first_request"),
        ("the run", "last_reply"),
        ("last outcomes, worker shutdown", "workers_done"),
        ("merge, statistics", "finished"),
        ("exit", "exited"),
    ]
    out, before = [], started
    for label, key in order:
        if key in marks:
            out.append(f"{label} {marks[key] - before:.3f}")
            before = marks[key]
    return ", ".join(out)


def _bare_interpreter() -> float:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    walls = []
    for _ in range(3):
        t = time.monotonic()
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
        walls.append(time.monotonic() - t)
    return min(walls)


def schedule_floor(
    n: int, conc: int, calls: int = 3, latency: float = 1.0, jitter: float = 0.2, runs: int = 5
) -> float:
    """The wall time, as a multiple of N·L/C, of a runner with no overhead at all: sessions of `calls` replies,
    each latency × U(1 - jitter, 1 + jitter), each session handed the next prompt the instant it is free
    (the mean over `runs` seeded draws). N·L/C assumes the work divides evenly; a session's replies cannot
    be split, so the last prompts, handed out as the dataset runs dry, finish up to a session's length
    later while the other sessions have nothing left to do."""
    floors = []
    for seed in range(runs):
        rng = random.Random(seed)
        free = [0.0] * conc  # a heap of the times each session is next free
        end = 0.0
        for _ in range(n):
            start = heapq.heappop(free)
            done = start + sum(latency * rng.uniform(1 - jitter, 1 + jitter) for _ in range(calls))
            heapq.heappush(free, done)
            end = max(end, done)
        floors.append(end / (n * calls * latency / conc))
    return sum(floors) / runs


def bare_client(n: int, conc: int) -> dict:
    """bench/bare_client.py's wall time for the same prompts, calls and endpoint as (10): what is left of the
    figure with everything a runner does taken away, measured on this machine beside the runner."""
    with Server(latency=1.0, jitter=0.2, asyncio=True) as srv:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        cmd = [sys.executable, str(Path(__file__).with_name("bare_client.py")), "--base_url", srv.base_url]
        started = time.monotonic()
        out = subprocess.run(
            [*cmd, f"--prompts={n}", f"--concurrency={conc}"], capture_output=True, text=True, env=env, check=True
        )
        wall = time.monotonic() - started
    counts = json.loads(out.stdout)
    if counts["done"] != n or counts["answered"] != n:
        raise RuntimeError(f"bare client: {n} prompts asked, {counts}")
    return dict(counts, wall=wall)


def _runner(n: int, conc: int) -> dict:
    with Server(latency=1.0, jitter=0.2, asyncio=True) as srv:
        before = srv.cpu_seconds()
        r = run_cli(f"sessions_{n}x{conc}", write_dataset(n), srv.base_url, f"--concurrency={conc}")
        r["server_cpu"] = srv.cpu_seconds() - before
        r["endpoint"] = srv.timings()
    check_all_done(f"sessions_{n}", r, n)
    return r


def bench_sessions(results: dict, which: set[str]) -> None:
    """(10) 5,000 × 3 at concurrency 1,024 and (10b) 2,000 × 3 at 256, 1 s ± 20 %.

    (10) is judged against the bare client: the runner and the bare client take turns twice, and the
    fastest of each counts (on a shared machine a run is only ever slowed by the others' load).
    """
    # (key, prompts, concurrency, target, judged against: "ideal" N·L/C or the "bare" client's wall, rounds)
    for key, n, conc, target, against, rounds in (
        ("10", 5000, 1024, 1.05, "bare", 2),
        ("10b", 2000, 256, 1.08, "ideal", 1),
    ):
        if key not in which:
            continue
        runs, bares = [], []
        for i in range(rounds):
            for what in ("runner", "bare") if i % 2 == 0 else ("bare", "runner"):
                if what == "runner":
                    runs.append(_runner(n, conc))
                else:
                    bares.append(bare_client(n, conc))
        r, bare = min(runs, key=lambda x: x["wall"]), min(bares, key=lambda x: x["wall"])
        ideal = n * 3 * 1.0 / conc
        ratio = r["wall"] / ideal
        floor = schedule_floor(n, conc)
        peak = max(x["peak_rss"] for x in runs)
        judged = ratio if against == "ideal" else r["wall"] / bare["wall"]
        results[f"sessions_{conc}"] = dict(
            r, ideal=ideal, floor=floor, bare=bare, judged=judged, runs=runs, bares=bares
        )
        every = ""
        if rounds > 1:
            walls = [", ".join(f"{x['wall']:.2f}" for x in xs) for xs in (runs, bares)]
            every = f" (every run: runner {walls[0]} s, bare client {walls[1]} s)"
        report(
            results,
            f"sessions_{conc}",
            f"({key}) {n} prompts x 3 calls at 1 s +-20 %, concurrency {conc}: wall {r['wall']:.1f} s (run phase "
            f"{r['run_seconds']:.1f} s), ideal {ideal:.2f} s, ratio {ratio:.3f}; the same requests and nothing else "
            f"(bare_client.py): {bare['wall'] / ideal:.3f}, so the runner takes {r['wall'] / bare['wall']:.3f}x a bare "
            f"client{every}; a schedule without any overhead: {floor:.3f} (schedule_floor); at most "
            f"{r['endpoint']['peak_in_flight']} requests in flight; peak RSS {peak / MIB:.0f} MiB over "
            f"{r['peak_procs']} processes; CPU: runner {r['cpu']:.1f} s, endpoint {r['server_cpu']:.1f} s; "
            f"failed {r['samples']['failed']} [target {'wall' if against == 'ideal' else 'runner / bare client'} "
            f"<= {target}{' x ideal' if against == 'ideal' else ''}: {'met' if judged <= target else 'NOT met'}; "
            f"<= 2 GiB: {'met' if peak <= 2 * GIB else 'NOT met'}]",
        )
