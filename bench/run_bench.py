"""The benchmarks: throughput near N·L/C, memory, CPU per prompt, resume scan + merge, scheduling.

    python bench/run_bench.py                 # every benchmark (several minutes)
    python bench/run_bench.py --only 1,2      # some of them: 1 throughput, 2 memory, 3 CPU, 4 resume, 5 batch vs prompt
    python bench/run_bench.py --only 1b       # only the concurrency-256 throughput run of (1)
    python bench/run_bench.py --only 6        # optional: throughput through Ray (--ray_address=local)
    python bench/run_bench.py --only 7        # --export=parquet over the 100,000-trajectory corpus of (4)
    python bench/run_bench.py --only 8,9,10,10b  # samples in flight at every size (bench_scale.py): layouts of 32
                                                 # slots, fixed overhead, 1,024 and 256 samples in flight
    python bench/run_bench.py --only 11       # adaptive concurrency against a rate-limited endpoint (11n: no headers;
                                              # 11p: what the probe costs an endpoint without limits)
    python bench/run_bench.py --only 12       # sandbox starts paced apart, against the engine's best parallelism
    python bench/run_bench.py --only 13       # per-prompt cost of the bwrap, local and docker sandboxes
    python bench/run_bench.py --only 14       # what a call of an MCP tool costs the runner (bench_mcp.py)
    python bench/run_bench.py --only 15       # --report over 100,000 lines: size, time to write, first paint in Chromium
    python bench/run_bench.py --only 16,16n,17  # the pacer against a window limit: Retry-After only, a bare 429,
                                                # a limit that moves (bench_pacing.py)
    python bench/run_bench.py --only 16f      # the first second of a rate-limited run (issue 38)
    python bench/run_bench.py --only 18       # what pacing costs (8), (9), (10b), (10) against no limit
    python bench/run_bench.py --only 19,19s   # tool-calling runs against their floor; each sandbox's cost per call
    python bench/run_bench.py --only 20       # finding plug-ins' entry points: importlib.metadata, cached, the old scan
    python bench/run_bench.py --only 21,22    # the model-call cache: a hit and a miss against a call; --rescore
    python bench/run_bench.py --only 23       # what starting one command costs the machine, every candidate way
    python bench/run_bench.py --only 24,24s   # the tool-heavy run (120 prompts x 10 commands) against its floor

The scripted server runs in its own process; every prompt's default replies call read_file twice, then
answer. The runner is the real CLI in a subprocess; its memory is the summed RSS of its process tree
(sampled with psutil) and its CPU time comes from getrusage(RUSAGE_CHILDREN) around it, so the
server's CPU is never counted. Outputs go to bench/out/ (gitignored). Not run by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import psutil
from bench_cache import bench_cache
from bench_command_cost import bench_command_cost
from bench_entry_points import bench_entry_points
from bench_export import bench_export
from bench_mcp import bench_mcp
from bench_pacing import bench_first_second, bench_moving_limit, bench_pacing_cost, bench_retry_after_only
from bench_rate_limit import bench_probe_cost, bench_rate_limit
from bench_report import bench_report
from bench_rescore import bench_rescore
from bench_resume import bench_resume
from bench_sandbox_starts import bench_sandbox_starts
from bench_sandboxes import bench_sandboxes
from bench_scale import bench_layouts, bench_overhead, bench_sessions
from bench_scheduling import bench_scheduling
from bench_tool_floor import bench_tool_floor, bench_tool_heavy
from common import CALLS_PER_PROMPT, GIB, MIB, OUT, Server, check_all_done, report, run_cli, write_dataset


def bench_throughput(results: dict, which: set[str]) -> None:
    """(1) wall ÷ N·L/C at 64 and 256 in flight; (2) peak memory at 256."""
    for n, conc in ((1000, 64), (2000, 256)):
        if conc == 64 and "1" not in which:  # "1b": the concurrency-256 run only
            continue
        workers = 2
        with Server(latency=1.0, jitter=0.2) as srv:
            name = f"throughput_{n}x{conc}"
            before = srv.cpu_seconds()
            r = run_cli(name, write_dataset(n), srv.base_url, f"--num_workers={workers}", f"--concurrency={conc}")
            r["server_cpu"] = srv.cpu_seconds() - before
        check_all_done(name, r, n)
        ideal = n * CALLS_PER_PROMPT * 1.0 / conc
        results[name] = dict(r, ideal=ideal)
        if which & {"1", "1b"}:
            ratio = r["wall"] / ideal
            report(
                results,
                name,
                f"(1) {n} prompts x {CALLS_PER_PROMPT} calls, concurrency {conc}, {workers} workers: wall {r['wall']:.1f} s "
                f"(run phase {r['run_seconds']:.1f} s), ideal {ideal:.1f} s, ratio {ratio:.3f}; CPU: runner "
                f"{r['cpu']:.1f} s, server {r['server_cpu']:.1f} s "
                f"[target <= 1.15: {'met' if ratio <= 1.15 else 'NOT met'}]",
            )
        if conc == 256 and "2" in which:
            peak = r["peak_rss"]
            report(
                results,
                "memory",
                f"(2) peak RSS of all runner processes at concurrency 256: {peak / MIB:.0f} MiB over "
                f"{r['peak_procs']} processes [target <= 4 GiB: {'met' if peak <= 4 * GIB else 'NOT met'}]",
            )


def bench_cpu(results: dict, n: int = 2000) -> None:
    """(3) CPU seconds of the runner's processes per prompt, at zero latency."""
    with Server(latency=0.0) as srv:
        small = run_cli("cpu_small", write_dataset(100), srv.base_url, "--num_workers=2", "--concurrency=16")
        r = run_cli("cpu", write_dataset(n), srv.base_url, "--num_workers=2", "--concurrency=16")
    check_all_done("cpu", r, n)
    per = r["cpu"] / n
    marginal = (r["cpu"] - small["cpu"]) / (n - 100)
    results["cpu"] = dict(r, per_prompt=per, marginal=marginal, fixed=small["cpu"] - 100 * marginal)
    report(
        results,
        "cpu",
        f"(3) runner CPU at zero latency, {n} prompts: {r['cpu']:.2f} s = {per * 1000:.2f} ms/prompt all in "
        f"(marginal {marginal * 1000:.2f} ms/prompt + {small['cpu'] - 100 * marginal:.2f} s startup/merge; "
        f"parent ~{r['cpu_parent_seen']:.1f} s, workers ~{r['cpu_others_seen']:.1f} s) "
        f"[target <= 5 ms: {'met' if per <= 0.005 else 'NOT met'}]",
    )


def bench_ray(results: dict, n: int = 1000, conc: int = 64) -> None:
    """(6) the throughput run of (1) through RayExecutor on a local Ray instance."""
    with Server(latency=1.0, jitter=0.2) as srv:
        r = run_cli(
            "ray_throughput",
            write_dataset(n),
            srv.base_url,
            "--num_workers=2",
            f"--concurrency={conc}",
            "--ray_address=local",
        )
    check_all_done("ray", r, n)
    ideal = n * CALLS_PER_PROMPT / conc
    results["ray"] = dict(r, ideal=ideal)
    report(
        results,
        "ray",
        f"(6) Ray (local instance), {n} prompts x {CALLS_PER_PROMPT} calls, concurrency {conc}: wall {r['wall']:.1f} s "
        f"(run phase {r['run_seconds']:.1f} s), ideal {ideal:.1f} s, ratio {r['wall'] / ideal:.3f}",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default="1,2,3,4,5,8,9,10,10b",
        help="comma-separated benchmark numbers (6 = Ray, 7 = Parquet export, 11-12 limits, 13 sandboxes, 14 MCP, "
        "15 report; 1b, 10b: one run)",
    )
    which = {w.strip() for w in parser.parse_args().only.split(",") if w.strip()}
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "python": sys.version.split()[0]}
    results["machine"] = {"nproc": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1)}
    print(f"machine: {results['machine']}, Python {results['python']}", flush=True)
    if which & {"1", "1b", "2"}:
        bench_throughput(results, which)
    if "3" in which:
        bench_cpu(results)
    if "4" in which:
        bench_resume(results)
    if "5" in which:
        bench_scheduling(results)
    if "6" in which:
        bench_ray(results)
    if "7" in which:
        bench_export(results)
    if "8" in which:
        bench_layouts(results)
    if "9" in which:
        bench_overhead(results)
    if which & {"10", "10b"}:
        bench_sessions(results, which)
    if "11" in which:
        bench_rate_limit(results, headers=True)
    if "11n" in which:  # an endpoint that sends Retry-After only
        bench_rate_limit(results, headers=False)
    if "11p" in which:  # what the probe costs an endpoint without limits
        bench_probe_cost(results)
    if "12" in which:
        bench_sandbox_starts(results)
    if "13" in which:
        bench_sandboxes(results)
    if "14" in which:
        bench_mcp(results)
    if "15" in which:
        bench_report(results)
    if "16" in which:
        bench_retry_after_only(results, "retry-after")
    if "16n" in which:
        bench_retry_after_only(results, "none")
    if "16f" in which:
        bench_first_second(results)
    if "17" in which:
        bench_moving_limit(results)
    if "18" in which:
        bench_pacing_cost(results)
    if which & {"19", "19s"}:
        bench_tool_floor(results, sandboxes="19s" in which)
    if "20" in which:
        bench_entry_points(results)
    if "21" in which:
        bench_cache(results)
    if "22" in which:
        bench_rescore(results)
    if "23" in which:
        bench_command_cost(results)
    if which & {"24", "24s"}:
        bench_tool_heavy(results, sandboxes="24s" in which)
    (OUT / f"results_{time.strftime('%Y%m%d_%H%M%S')}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
