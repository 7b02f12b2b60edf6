"""The Python API's rollouts (agentbatch.Rollouts) against the CLI on the same work, its first group's latency, and
its memory while a slow consumer holds the stream (bench/RESULTS.md, "Rollouts").

    python bench/bench_rollouts.py [--prompts 300] [--latency 0.2] [--concurrency 32]

(a) the same N prompts × 3 model calls at a scripted endpoint of latency L, concurrency C, recorded in a run
directory: the CLI's wall time (process start to exit) against a Python caller's doing the same with
Rollouts(run_name=...) and one run() (process start to exit), alternated, each twice; the ratio of the sums.
(b) in that caller: seconds from run() to its first group, against one sample's time (3 L) and the batch's.
(c) a caller of 2,000 tasks reading one group every 0.2 s for 10 s: its process tree's RSS and the samples
started, each second; the samples started stay within the window, the RSS flat.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import OUT, ROOT, Server, report, run_cli, write_dataset
from tree_sampler import TreeSampler

CHILD = """
import json, sys, time
t0 = time.monotonic()
sys.path.insert(0, {root!r})
from agentbatch import Rollouts
t1 = time.monotonic()

def main():
    args = json.loads(sys.argv[1])
    tasks = [json.loads(line) for line in open(args.pop("tasks_file"))]
    pause, reads = args.pop("pause", 0.0), args.pop("reads", None)
    rollouts = Rollouts(**args)
    t2 = time.monotonic()
    with rollouts:
        start = time.monotonic()
        groups = rollouts.run(tasks)
        first = None
        for n, g in enumerate(groups, 1):
            first = first or time.monotonic() - start
            if pause:
                print(json.dumps({{"read": n, "t": time.monotonic() - start}}), flush=True)
                time.sleep(pause)
                if n == reads:
                    groups.close()
                    break
        ran = time.monotonic()
    phases = [t1 - t0, t2 - t1, start - t2, ran - start, time.monotonic() - ran]
    print(json.dumps({{"first": first, "all": ran - start, "phases": phases}}), flush=True)

if __name__ == "__main__":
    main()
"""


def api_run(name: str, dataset, base_url: str, concurrency: int, **more) -> dict:
    """A Python caller in its own process: wall time start to exit, its own figures (last stdout line)."""
    runs = OUT / "runs"
    child = OUT / "rollouts_child.py"
    child.write_text(CHILD.format(root=str(ROOT)))
    args = {
        "tasks_file": str(dataset),
        "model": "bench-model",
        "base_url": base_url,
        "api_key": "sk-bench-not-a-real-key",
        "sandbox": "local",
        "seed": 1,
        "max_retries": 2,
        "concurrency": concurrency,
        "batch_size": 100,
        **({"run_name": name, "output_dir": str(runs)} if name else {}),
        **more,
    }
    if name:
        subprocess.run(["rm", "-rf", str(runs / name)], check=True)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(child), json.dumps(args)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    lines = []
    for line in proc.stdout:
        lines.append(json.loads(line))
    proc.wait()
    sampler.stop()
    if proc.returncode:
        raise RuntimeError(f"{name}: exit {proc.returncode}")
    return {"wall": time.monotonic() - start, "peak_rss": sampler.peak, "lines": lines}


def overhead(args, results: dict) -> None:
    n, c, latency = args.prompts, args.concurrency, args.latency
    dataset = write_dataset(n)
    cli_walls, api_walls, firsts, alls, phases, sessions = [], [], [], [], [], []
    with Server(latency) as srv:
        for i in range(2):
            cli = run_cli(f"rollouts_cli_{i}", dataset, srv.base_url, f"--concurrency={c}")
            if cli["samples"]["done"] != n:
                raise RuntimeError(f"cli: {cli['samples']}")
            cli_walls.append(cli["wall"])
            sessions.append(cli["run_seconds"])
            api = api_run(f"rollouts_api_{i}", dataset, srv.base_url, c)
            stats = json.loads((OUT / "runs" / f"rollouts_api_{i}" / "statistics.json").read_text())
            if stats["samples"]["done"] != n:
                raise RuntimeError(f"api: {stats['samples']}")
            api_walls.append(api["wall"])
            firsts.append(api["lines"][-1]["first"])
            alls.append(api["lines"][-1]["all"])
            phases.append("/".join(f"{p:.2f}" for p in api["lines"][-1]["phases"]))
    ratio = sum(api_walls) / sum(cli_walls)
    report(
        results,
        "overhead",
        f"(a) {n} prompts × 3 calls, L={latency} s, C={c}: CLI {', '.join(f'{w:.2f}' for w in cli_walls)} s, "
        f"API {', '.join(f'{w:.2f}' for w in api_walls)} s: API ÷ CLI = {ratio:.3f}; the CLI's sessions "
        f"{', '.join(f'{w:.2f}' for w in sessions)} s, the API's import/settings/start/run/end {', '.join(phases)} s",
    )
    report(
        results,
        "first",
        f"(b) first group after {', '.join(f'{f:.2f}' for f in firsts)} s (one sample: {3 * latency:.2f} s of "
        f"endpoint time), the batch's {', '.join(f'{a:.2f}' for a in alls)} s",
    )


def slow_consumer(args, results: dict) -> None:
    n, c = 2000, args.concurrency
    dataset = write_dataset(n)
    with Server(0.05) as srv:
        api = api_run("", dataset, srv.base_url, c, pause=0.2, reads=50)
        started = len(srv.get("/_requests")) // 3
    reads = [line for line in api["lines"] if "read" in line]
    window = max(2, -(-2 * c // 1))
    report(
        results,
        "slow",
        f"(c) {n} tasks, C={c}, a group read every 0.2 s, {len(reads)} read in {reads[-1]['t']:.1f} s: "
        f"{started} samples started (window {window} + read), peak tree RSS {api['peak_rss'] / 2**20:.0f} MiB",
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=300)
    p.add_argument("--latency", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=32)
    args = p.parse_args()
    results: dict = {}
    overhead(args, results)
    slow_consumer(args, results)
    (OUT / "bench_rollouts.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
