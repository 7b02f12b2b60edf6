"""(19) Tool-calling runs against their floor, and what a command costs a call in each sandbox.

Each prompt's first reply calls `terminal` once (`pwd; ls /`), its second answers. The floor of a run is
ceil(N / C) × calls × L: rounds of C prompts, each prompt two replies of latency L apart, nothing else.
Two workloads, as issue 30 measured them: 120 prompts at 0.5 s with --concurrency 64, 1,000 at 1.0 s with
--concurrency 256. The endpoint (bench/async_endpoint.py) notes for every prompt the time from its first
reply to its second request: the runner's work between two calls (the tool call in its sandbox, the
messages, the next request), measured where it shows in the wall time.

(19)  wall ÷ floor with the default sandbox (bwrap), every other flag at its default.
(19s) the same runs in each sandbox (local, bwrap, docker; docker for the first workload only: 1,000
      containers would take the shared engine minutes), and the time between a prompt's two calls.
(24)  the tool-heavy run of issue 38: 120 prompts whose replies call `terminal` ten times, one after the
      other, then answer (11 model calls), at 0.5 s, --concurrency 64; its floor 2 × 11 × 0.5 = 11 s. With
      (24s), in each sandbox.
"""

from __future__ import annotations

import math
import statistics

from bench_sandboxes import _docker_image
from common import Server, check_all_done, report, run_cli, write_dataset

COMMAND = "pwd; ls /"
REPLIES = [
    {"reasoning": "Look around.", "tool_calls": [{"name": "terminal", "arguments": {"command": COMMAND}}]},
    {"reasoning": "I have seen it.", "content": "Done with: {prompt}"},
]
WORKLOADS = ((120, 64, 0.5), (1000, 256, 1.0))
HEAVY = (120, 64, 0.5, 10)  # prompts, concurrency, latency, terminal calls per prompt


def replies(commands: int) -> list[dict]:
    """A prompt's replies: `commands` terminal calls, one per reply, then the answer."""
    return [REPLIES[0]] * commands + [REPLIES[1]]


def floor_of(n: int, conc: int, latency: float, calls: int = 2) -> float:
    return math.ceil(n / conc) * calls * latency


def tool_run(n: int, conc: int, latency: float, sandbox: str, extra: tuple[str, ...] = (), commands: int = 1) -> dict:
    """One CLI run of the workload in `sandbox`: its figures and the endpoint's gaps between a prompt's calls."""
    calls = commands + 1
    with Server(latency=latency, asyncio=True, script=replies(commands)) as srv:
        r = run_cli(
            f"tools_{sandbox}_{n}x{conc}x{commands}",
            write_dataset(n),
            srv.base_url,
            f"--concurrency={conc}",
            f"--sandbox={sandbox}",
            f"--max_turns={max(10, calls)}",  # the default 10 model calls would end (24)'s samples a call early
            *extra,
        )
        seen = srv.timings()
    check_all_done(f"tools {sandbox} {n}", r, n, calls=calls)
    gaps = sorted(seen["gaps"])
    floor = floor_of(n, conc, latency, calls)
    return dict(
        r,
        floor=floor,
        ratio=r["wall"] / floor,
        gap_median=statistics.median(gaps),
        gap_p90=gaps[int(0.9 * (len(gaps) - 1))],
        gap_max=gaps[-1],
        start=seen["first_request"] - r["started"],
        end=r["ended"] - seen["last_reply"],
    )


def _line(r: dict) -> str:
    return (
        f"wall {r['wall']:.2f} s = {r['ratio']:.3f} x floor {r['floor']:.1f} s (start {r['start']:.2f} s, end "
        f"{r['end']:.2f} s); reply -> next request median {r['gap_median'] * 1000:.0f} ms, p90 "
        f"{r['gap_p90'] * 1000:.0f} ms, max {r['gap_max'] * 1000:.0f} ms; runner CPU {r['cpu']:.1f} s"
    )


def bench_tool_heavy(results: dict, sandboxes: bool = False) -> None:
    """(24) the tool-heavy run in the default sandbox, and with `sandboxes` (24s) in local and docker too."""
    n, conc, latency, commands = HEAVY
    image = _docker_image() if sandboxes else None
    kinds = ["bwrap"] + (["local"] if sandboxes else []) + (["docker"] if image else [])
    for kind in kinds:
        extra = (f"--docker_image={image}",) if kind == "docker" else ()
        r = tool_run(n, conc, latency, kind, extra, commands=commands)
        results.setdefault("tool_heavy", []).append(dict(r, sandbox=kind))
        target = "" if kind != "bwrap" else f" [target <= 1.15: {'met' if r['ratio'] <= 1.15 else 'NOT met'}]"
        report(
            results,
            "tool_heavy",
            f"({'24' if kind == 'bwrap' else '24s'}) {n} prompts x {commands} `{COMMAND}` calls + an answer at "
            f"{latency} s, concurrency {conc}, sandbox {kind}: {_line(r)}{target}",
        )


def bench_tool_floor(results: dict, sandboxes: bool = False) -> None:
    """(19), and with `sandboxes` (19s) every sandbox's runs."""
    image = _docker_image() if sandboxes else None
    for n, conc, latency in WORKLOADS:
        kinds = ["bwrap"] + (["local"] if sandboxes else []) + (["docker"] if image and n <= 200 else [])
        for kind in kinds:
            extra = (f"--docker_image={image}",) if kind == "docker" else ()
            r = tool_run(n, conc, latency, kind, extra)
            results.setdefault("tool_floor", []).append(dict(r, n=n, conc=conc, latency=latency, sandbox=kind))
            target = "" if kind != "bwrap" else f" [target <= 1.25: {'met' if r['ratio'] <= 1.25 else 'NOT met'}]"
            report(
                results,
                "tool_floor",
                f"({'19' if kind == 'bwrap' else '19s'}) {n} prompts x 2 calls at {latency} s, one `{COMMAND}` each, "
                f"concurrency {conc}, sandbox {kind}: {_line(r)}{target}",
            )
