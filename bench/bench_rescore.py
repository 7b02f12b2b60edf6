"""(22) What --rescore costs: checks run again on a finished run, measured against the checks' own time.

1,000 samples whose `answer` changed after the run: the rescore's wall and CPU time (the CLI's start, reading
every line, a string comparison each, the batch files replaced, the merge and statistics), against a rescore
that finds nothing to check (the same start, reading and statistics, no check): what the checks cost is the
difference. Then 100 samples whose `verify` changed, kept with --keep_final_state in local sandboxes: the
rescore's wall against the sum of the new checks' own seconds (each in a fresh sandbox holding its state)
divided by the checks run at once.

    python bench/bench_rescore.py            # or: python bench/run_bench.py --only 22
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from common import OUT, ROOT, Server, report, run_cli

SCRIPT = [
    {"tool_calls": [{"name": "terminal", "arguments": {"command": "seq 1 50 > out.txt && echo made"}}]},
    {"content": "The answer is 41."},
]
RUN = ("--concurrency=32", "--require_reasoning=false", "--distribution=terminal_only")


def _dataset(name: str, n: int, check: dict) -> str:
    path = OUT / f"rescore_{name}.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"Rescore benchmark {name} {i}", **check}) + "\n")
    return str(path)


def _rescore(run: str, dataset: str, *extra: str) -> dict:
    cmd = [sys.executable, str(ROOT / "batch_runner.py"), f"--dataset_file={dataset}", f"--run_name={run}"]
    cmd += [f"--output_dir={OUT / 'runs'}", "--rescore", "--sandbox=local", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"rescore of {run}: exit {done.returncode}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "summary": done.stdout.strip().splitlines()[-1]}


def _lines(run: str) -> list[dict]:
    text = (OUT / "runs" / run / "trajectories.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def bench_rescore(results: dict) -> None:
    n = 1000
    with Server(latency=0.0, script=SCRIPT) as srv:
        answers = _dataset("answers", n, {"answer": "42"})
        run_cli("rescore_answers", answers, srv.base_url, *RUN)
        verifies = _dataset("verifies", 100, {"verify": "test -f nothing.txt"})
        run_cli("rescore_verifies", verifies, srv.base_url, *RUN, "--keep_final_state")
    answers = _dataset("answers", n, {"answer": "41"})
    changed = _rescore("rescore_answers", answers)
    same = _rescore("rescore_answers", answers)  # every line's row as it says now: nothing to check
    per = (changed["wall"] - same["wall"]) / n * 1000
    results["rescore_answers"] = {"changed": changed, "unchanged": same}
    report(
        results,
        "rescore_answers",
        f"(22) {n} samples whose answer changed: rescore {changed['wall']:.2f} s wall, {changed['cpu']:.2f} s CPU; "
        f"with nothing to check {same['wall']:.2f} s, {same['cpu']:.2f} s CPU: the checks and the files replaced "
        f"{per:.2f} ms a sample ({changed['summary'][:60]}...)",
    )
    verifies = _dataset("verifies", 100, {"verify": "test $(wc -l < out.txt) = 50 && grep -qx 50 out.txt"})
    parallel = 8
    done = _rescore("rescore_verifies", verifies, f"--concurrency={parallel}")
    lines = _lines("rescore_verifies")
    own = sum(r["check"]["seconds"] for r in lines)
    passed = sum(r["passed"] is True for r in lines)
    results["rescore_verifies"] = {**done, "checks_seconds": own, "passed": passed}
    report(
        results,
        "rescore_verifies",
        f"(22) 100 samples whose verify changed, local sandboxes, {parallel} at once: rescore {done['wall']:.2f} s "
        f"wall ({passed} now pass); the checks' own time {own:.2f} s, {own / parallel:.2f} s over {parallel} at once "
        f"(a sandbox made, the state put in and the sandbox removed are the rest)",
    )


if __name__ == "__main__":
    bench_rescore({})
