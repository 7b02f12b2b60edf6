"""(20) What finding the plug-ins' entry points costs a runner's start: importlib.metadata against the scan of
`entry_points.txt` files that agentbatch/plugins.py did by hand before (kept here as the baseline).

Each way runs in a fresh interpreter (as at a run's start: nothing cached), the ways taking turns, and the
median and fastest of each are printed with the ratio to the hand-written scan, measured in the same run.
`import importlib.metadata` is timed inside each way that needs it (a start pays it unless a dependency
imported it already: on this machine urllib3, which the docker SDK imports, does), and once alone.

    python bench/bench_entry_points.py            # or: python bench/run_bench.py --only 20
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from common import OUT, ROOT, report

# The hand-written scan plugins.py had until this benchmark (its entry_points and _parse_entry_points).
HAND_SCAN = """
import os, sys
GROUPS = ("batch_runner.tools", "batch_runner.sandboxes", "batch_runner.datasets", "batch_runner.models")
def parse(text):
    out, group = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group in GROUPS and "=" in line:
            name, _, value = line.partition("=")
            out.append((group, name.strip(), value.split("[")[0].strip()))
    return out
def scan():
    found, seen = [], set()
    for folder in sys.path:
        try:
            entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if not entry.name.endswith((".dist-info", ".egg-info")):
                continue
            dist = entry.name.rsplit(".", 1)[0].split("-")[0].lower().replace("_", "-")
            if dist in seen:
                continue
            seen.add(dist)
            try:
                with open(os.path.join(entry.path, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            if "batch_runner." in text:
                found.extend(parse(text))
    return sorted(found)
"""
GROUPS = "('batch_runner.tools', 'batch_runner.sandboxes', 'batch_runner.datasets', 'batch_runner.models')"
WAYS = {
    "hand-written scan (before)": HAND_SCAN + "found = scan()",
    "importlib.metadata (a cache miss: entry_points(), the groups selected)": (
        f"from agentbatch import entry_points\nfound = entry_points._scan({GROUPS})"
    ),
    "importlib.metadata, entry_points(group=...) per group": (
        f"import importlib.metadata as m\nfound = [e for g in {GROUPS} for e in m.entry_points(group=g)]"
    ),
    "entry_points.find (now: a cache hit)": f"from agentbatch import entry_points\nfound = entry_points.find({GROUPS})",
    "import importlib.metadata alone": "import importlib.metadata\nfound = []",
}
# What the runner has imported anyway before it looks for entry points; the rest is timed.
TIMED = """
import sys, os, json, hashlib, tempfile, pathlib, time
sys.path.insert(0, {root!r})
wall, cpu = time.perf_counter(), time.process_time()
{code}
print(time.perf_counter() - wall, time.process_time() - cpu, len(found))
"""
RUNS = 21


def _once(code: str, env: dict) -> tuple[float, float, int]:
    out = subprocess.run(
        [sys.executable, "-c", TIMED.format(root=str(ROOT), code=code)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def _distributions() -> int:
    import importlib.metadata

    return sum(1 for _ in importlib.metadata.distributions())


def bench_entry_points(results: dict) -> None:
    """(20) each way's CPU and wall time in a fresh interpreter, medians of RUNS, the ways taking turns."""
    env = dict(os.environ, XDG_CACHE_HOME=str(OUT / "entry_points_cache"))
    _once(WAYS["entry_points.find (now: a cache hit)"], env)  # the cache written once, as by a first run
    cpu: dict[str, list[float]] = {way: [] for way in WAYS}
    wall: dict[str, list[float]] = {way: [] for way in WAYS}
    found: dict[str, int] = {}
    for _ in range(RUNS):
        for way, code in WAYS.items():
            w, c, n = _once(code, env)
            wall[way].append(w)
            cpu[way].append(c)
            found[way] = n
    base = statistics.median(cpu["hand-written scan (before)"])
    results["entry_points"] = {"cpu": cpu, "wall": wall, "found": found, "distributions": _distributions()}
    shown = "; ".join(
        f"{way}: CPU {statistics.median(cpu[way]) * 1000:.1f} ms ({statistics.median(cpu[way]) / base:.2f}x the "
        f"scan), wall {statistics.median(wall[way]) * 1000:.1f} ms, {found[way]} found"
        for way in WAYS
    )
    report(
        results,
        "entry_points",
        f"(20) entry points of {results['entry_points']['distributions']} installed distributions, "
        f"fresh interpreters, medians of {RUNS} turns: {shown}",
    )


if __name__ == "__main__":
    bench_entry_points({})
