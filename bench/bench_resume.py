"""(4) The resume scan and the merge with statistics over a synthetic 100,000-trajectory run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from common import MIB, OUT, ROOT, report


def synthesize_corpus(n: int = 100_000, per_batch: int = 1000) -> Path:
    """n realistic stored trajectories (build_record over a read/terminal conversation), ~10 KB each."""
    run_dir = OUT / "resume_corpus"
    marker = run_dir / f".complete_{n}"
    if marker.exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    from agentbatch import plugins
    from agentbatch.tools.registry import load_tools
    from trajectory import build_record

    plugins.load()  # the built-in tools registered, as at a run's start

    tools = load_tools()
    schemas = [t.schema() for t in tools.values()]
    listing = "\n".join(
        f"-rw-r--r-- 1 user user {i * 37 % 9000:>5} Jan 15 10:{i % 60:02d} file_{i}.py" for i in range(40)
    )
    source = "".join(f"def f_{i}(x):\n    return x * {i} + {i * i}  # line {i}\n" for i in range(70))
    for b in range(n // per_batch):
        with open(run_dir / f"batch_{b}.jsonl", "w", encoding="utf-8") as f:
            for j in range(per_batch):
                i = b * per_batch + j
                prompt = f"Task {i}: inspect the project and explain what module_{i % 977}.py computes."
                messages = [
                    {"role": "user", "content": prompt},
                    {
                        "role": "assistant",
                        "content": "I'll list the files first.",
                        "reasoning": f"The user wants module_{i % 977}.py explained; start by listing.",
                        "tool_calls": [
                            {"id": f"call_{i}_0", "function": {"name": "terminal", "arguments": '{"command": "ls -l"}'}}
                        ],
                    },
                    {
                        "role": "tool",
                        "tool_call_id": f"call_{i}_0",
                        "name": "terminal",
                        "content": json.dumps({"output": listing, "exit_code": 0, "error": None}),
                    },
                    {
                        "role": "assistant",
                        "content": "",
                        "reasoning": "Now read the module.",
                        "tool_calls": [
                            {
                                "id": f"call_{i}_1",
                                "function": {
                                    "name": "read_file",
                                    "arguments": json.dumps({"path": f"module_{i % 977}.py"}),
                                },
                            }
                        ],
                    },
                    {
                        "role": "tool",
                        "tool_call_id": f"call_{i}_1",
                        "name": "read_file",
                        "content": json.dumps({"content": source, "total_lines": 140, "error": None}),
                    },
                    {
                        "role": "assistant",
                        "content": f"module_{i % 977}.py defines 70 affine functions. " * 8,
                        "reasoning": "Summarise.",
                    },
                ]
                record = build_record(
                    prompt_index=i,
                    messages=messages,
                    batch_num=b,
                    timestamp="2026-01-15T10:30:00",
                    model="bench-model",
                    completed=True,
                    partial=False,
                    stop_reason="answered",
                    api_calls=3,
                    toolsets=["terminal", "file"],
                    usage={"prompt_tokens": 2400, "completion_tokens": 300, "total_tokens": 2700},
                    tool_schemas=schemas[:5],
                )
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    marker.touch()
    return run_dir


RESUME_PROBE = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from agentbatch.run_dir.answers import done_counts
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.merge import merge
from agentbatch.run_statistics import Tally
files = RunFiles(sys.argv[2])
t0, c0 = time.monotonic(), time.process_time()
try:
    counts = done_counts(files.reader())
except AttributeError:  # the code before run_dir's reader (to measure both)
    counts = done_counts(files.paths, files.known_tools)
t1, c1 = time.monotonic(), time.process_time()
tally = Tally()  # as the session does: every kept line goes to the statistics and the outcomes, and is counted
merged = merge(files, tally.add_trajectory)
t2, c2 = time.monotonic(), time.process_time()
print(json.dumps({"scan_s": t1 - t0, "merge_s": t2 - t1, "scan_cpu": c1 - c0, "merge_cpu": c2 - c1,
                  "keys": len(counts), "kept": merged.trajectories,
                  "bytes": merged.bytes, "trajectories": tally.stats.trajectories,
                  "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def bench_resume(results: dict) -> None:
    """(4) done_counts + merge with statistics over 100,000 stored trajectories, in a fresh process."""
    run_dir = synthesize_corpus()
    out = subprocess.run([sys.executable, "-c", RESUME_PROBE, str(ROOT), str(run_dir)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    r = json.loads(out.stdout)
    (run_dir / "trajectories.jsonl").unlink(missing_ok=True)  # keep bench/out at one copy of the corpus
    mb = r["bytes"] / 1e6
    scan, merge = mb / r["scan_s"], mb / r["merge_s"]
    both = 2 * mb / (r["scan_s"] + r["merge_s"])
    results["resume"] = dict(r, scan_mb_s=scan, merge_mb_s=merge)
    ok_mem = r["maxrss"] <= 300 * MIB
    report(
        results,
        "resume",
        f"(4) {r['kept']} trajectories, {mb:.0f} MB: scan {r['scan_s']:.1f} s ({scan:.0f} MB/s), merge+stats "
        f"{r['merge_s']:.1f} s ({merge:.0f} MB/s), together {both:.0f} MB/s (CPU-bound rates: scan "
        f"{mb / r['scan_cpu']:.0f}, merge {mb / r['merge_cpu']:.0f} MB/s); peak RSS {r['maxrss'] / MIB:.0f} MiB "
        f"[targets <= 300 MiB: {'met' if ok_mem else 'NOT met'}; >= 100 MB/s: "
        f"{'met' if min(scan, merge) >= 100 else 'NOT met'}]",
    )
