"""(7) The Parquet export of the synthetic 100,000-trajectory run of (4): throughput and peak memory.

python bench/run_bench.py --only 7
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from bench_resume import synthesize_corpus
from common import MIB, ROOT, report

EXPORT_PROBE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from agentbatch.export.common import Filters
from agentbatch.export.run_export import export
t0, c0 = time.monotonic(), time.process_time()
doc = export(sys.argv[2], "resume_corpus", ("parquet",), Filters())
t1, c1 = time.monotonic(), time.process_time()
r = doc["parquet"]
print(json.dumps({"seconds": t1 - t0, "cpu": c1 - c0, "bytes": r["source"]["bytes"], "rows": r["written"],
                  "shards": r["shards"], "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def bench_export(results: dict) -> None:
    """(7) --export=parquet over 100,000 stored trajectories, in a fresh process (peak RSS from getrusage)."""
    run_dir = synthesize_corpus()
    out = subprocess.run([sys.executable, "-c", EXPORT_PROBE, str(ROOT), str(run_dir)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    written = sum(p.stat().st_size for p in (run_dir / "export" / "parquet" / "data").glob("*.parquet"))
    shutil.rmtree(run_dir / "export", ignore_errors=True)  # keep bench/out at one copy of the corpus
    mb = r["bytes"] / 1e6
    rate, cpu_rate = mb / r["seconds"], mb / r["cpu"]
    results["export"] = dict(r, mb_s=rate, cpu_mb_s=cpu_rate, parquet_bytes=written)
    # The rate judged is the CPU-bound one (MB per process CPU second): on this shared machine the wall rate
    # measures the other developers' load as much as the export.
    ok_mem, ok_rate = r["maxrss"] <= 300 * MIB, cpu_rate >= 50
    report(
        results,
        "export",
        f"(7) --export=parquet, {r['rows']} trajectories, {mb:.0f} MB of batch files -> {r['shards']} shards, "
        f"{written / 1e6:.0f} MB: {r['seconds']:.1f} s ({rate:.0f} MB/s wall; CPU-bound rate {cpu_rate:.0f} MB/s), "
        f"peak RSS {r['maxrss'] / MIB:.0f} MiB [targets <= 300 MiB: {'met' if ok_mem else 'NOT met'}; "
        f">= 50 MB/s CPU-bound: {'met' if ok_rate else 'NOT met'}]",
    )
