"""Benchmarks of issue 8: throughput near N·L/C, memory, CPU per prompt, resume scan + merge, scheduling.

    python bench/run_bench.py                 # every benchmark (several minutes)
    python bench/run_bench.py --only 1,2      # some of them: 1 throughput, 2 memory, 3 CPU, 4 resume, 5 batch vs prompt
    python bench/run_bench.py --only 1b       # only the concurrency-256 throughput run of (1)
    python bench/run_bench.py --only 6        # optional: throughput through Ray (--ray_address=local)

The scripted server runs in its own process; every prompt's default replies call read_file twice, then
answer. The runner is the real CLI in a subprocess; its memory is the summed RSS of its process tree
(sampled with psutil) and its CPU time comes from getrusage(RUSAGE_CHILDREN) around it, so the
server's CPU is never counted. Outputs go to bench/out/ (gitignored). Not run by CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))

CALLS_PER_PROMPT = 3
READ_PATH = "/etc/hostname"  # exists on every Linux machine; the local sandbox is an empty temp dir
DEFAULT_SCRIPT = [
    {"reasoning": "Let me look at the file.", "tool_calls": [{"name": "read_file", "arguments": {"path": READ_PATH}}]},
    {"reasoning": "Once more, to be sure.", "tool_calls": [{"name": "read_file", "arguments": {"path": READ_PATH}}]},
    {"reasoning": "I have what I need.", "content": "Done with: {prompt}"},
]
GIB = 1024**3
MIB = 1024**2


class Server:
    """scripted_server.py in a separate process."""

    def __init__(self, latency: float, jitter: float = 0.0, heavy_tail: bool = False, seed: int = 0):
        OUT.mkdir(parents=True, exist_ok=True)
        script = OUT / "default_script.json"
        script.write_text(json.dumps(DEFAULT_SCRIPT))
        cmd = [sys.executable, str(ROOT / "scripted_server.py"), "--port", "0", "--default_script", str(script)]
        cmd += ["--latency", str(latency), "--jitter", str(jitter), "--seed", str(seed)]
        if heavy_tail:
            cmd.append("--heavy_tail")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"scripted server did not start: {line!r}")
        self.base_url = line.split()[1]

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def write_dataset(n: int) -> Path:
    path = OUT / f"prompts_{n}.jsonl"
    if not path.exists():
        with open(path, "w") as f:
            for i in range(n):
                f.write(json.dumps({"prompt": f"Benchmark task {i}: summarise the file {READ_PATH}."}) + "\n")
    return path


class TreeSampler(threading.Thread):
    """Peak summed RSS of a process and all its descendants, sampled every 0.1 s."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.peak = 0
        self.peak_procs = 0
        self.cpu: dict[int, float] = {}  # last CPU seconds seen per process, for the parent/worker split
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            if total > self.peak:
                self.peak, self.peak_procs = total, len(procs)
            self._halt.wait(0.1)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_cli(name: str, dataset: Path, base_url: str, *extra: str, entry: list[str] | None = None) -> dict:
    """The real CLI in a subprocess: wall time, peak tree RSS, CPU seconds of its processes, statistics."""
    runs = OUT / "runs"
    shutil.rmtree(runs / name, ignore_errors=True)
    cmd = (entry or [sys.executable, str(ROOT / "batch_runner.py")]) + [
        f"--dataset_file={dataset}",
        "--batch_size=100",
        f"--run_name={name}",
        f"--base_url={base_url}",
        "--api_key=sk-bench-not-a-real-key",
        "--model=bench-model",
        f"--output_dir={runs}",
        "--max_retries=2",
        "--seed=1",
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - start
    sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{stderr[-3000:]}")
    stats = json.loads((runs / name / "statistics.json").read_text())
    return {
        "wall": wall,
        "peak_rss": sampler.peak,
        "peak_procs": sampler.peak_procs,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "prompts": stats["prompts"],
        "api_calls": stats["api_calls"],
        "run_seconds": stats["duration_seconds"],
        "cpu_parent_seen": sampler.cpu.get(proc.pid, 0.0),
        "cpu_others_seen": sum(v for k, v in sampler.cpu.items() if k != proc.pid),
        "loadavg": os.getloadavg(),
    }


def report(results: dict, key: str, line: str) -> None:
    line += f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    print(line, flush=True)
    results.setdefault("lines", []).append(line)


def check_all_done(name: str, r: dict, n: int) -> None:
    if r["prompts"]["done"] != n or r["api_calls"] != n * CALLS_PER_PROMPT:
        raise RuntimeError(f"{name}: expected {n} prompts done with {n * CALLS_PER_PROMPT} calls, got {r}")


def bench_throughput(results: dict, which: str = "12") -> None:
    """(1) wall ÷ N·L/C at 64 and 256 in flight; (2) peak memory at 256."""
    for n, conc in ((1000, 64), (2000, 256)):
        if conc == 64 and ("1" not in which or "b" in which):  # "1b": the concurrency-256 run only
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
        if "1" in which:
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


def synthesize_corpus(n: int = 100_000, per_batch: int = 1000) -> Path:
    """n realistic stored trajectories (build_record over a read/terminal conversation), ~10 KB each."""
    run_dir = OUT / "resume_corpus"
    marker = run_dir / f".complete_{n}"
    if marker.exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    from tool_registry import load_tools
    from trajectory import build_record

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
from run_files import RunFiles
from statistics_report import RunStats
files = RunFiles(sys.argv[2])
t0, c0 = time.monotonic(), time.process_time()
counts = files.done_counts()
t1, c1 = time.monotonic(), time.process_time()
stats = RunStats()
merged = files.merge(stats.add_trajectory)
t2, c2 = time.monotonic(), time.process_time()
print(json.dumps({"scan_s": t1 - t0, "merge_s": t2 - t1, "scan_cpu": c1 - c0, "merge_cpu": c2 - c1,
                  "keys": len(counts), "kept": merged.kept,
                  "bytes": merged.bytes_read, "trajectories": stats.trajectories,
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


def bench_scheduling(results: dict, n: int = 2000, conc: int = 256, batch_size: int = 8) -> None:
    """(5) batch-level (a slot runs a whole batch in order) vs prompt-level scheduling, heavy-tailed latency."""
    dataset = write_dataset(n)
    args = ("--num_workers=2", f"--concurrency={conc}", f"--batch_size={batch_size}")
    with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
        prompt_level = run_cli("sched_prompt", dataset, srv.base_url, *args)
    with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
        batch_level = run_cli(
            "sched_batch", dataset, srv.base_url, *args, entry=[sys.executable, __file__, BATCH_LEVEL_CLI]
        )
    per_worker = conc // 2
    os.environ["BENCH_BATCH_MODE"] = "barrier"
    try:
        with Server(latency=1.0, heavy_tail=True, seed=7) as srv:
            barrier = run_cli(
                "sched_barrier",
                dataset,
                srv.base_url,
                "--num_workers=2",
                f"--concurrency={conc}",
                f"--batch_size={per_worker}",
                entry=[sys.executable, __file__, BATCH_LEVEL_CLI],
            )
    finally:
        del os.environ["BENCH_BATCH_MODE"]
    for name, r in (("prompt", prompt_level), ("batch", batch_level), ("barrier", barrier)):
        check_all_done(name, r, n)
    ideal = n * CALLS_PER_PROMPT / conc
    ratio = batch_level["wall"] / prompt_level["wall"]
    ratio_barrier = barrier["wall"] / prompt_level["wall"]
    results["scheduling"] = {"prompt": prompt_level, "batch": batch_level, "barrier": barrier, "ratio": ratio}
    report(
        results,
        "scheduling",
        f"(5) heavy-tailed latency, {n} prompts, concurrency {conc}: prompt-level {prompt_level['wall']:.1f} s "
        f"(ideal {ideal:.1f} s); batch-level, each of the {conc} slots running a batch of {batch_size} in order, "
        f"{batch_level['wall']:.1f} s = {ratio:.2f}x; batch-level, each of the 2 workers running a batch of "
        f"{per_worker} on its threads and waiting for its slowest prompt, {barrier['wall']:.1f} s = "
        f"{ratio_barrier:.2f}x",
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


BATCH_LEVEL_CLI = "--batch-level-cli"


def _batch_slot_main(cfg, batches, results, threads: int, barrier: bool) -> None:
    import signal
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from prompt_runner import run_prompt

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if barrier:  # the worker runs its batch on all its threads and takes the next once the slowest is done
        with ThreadPoolExecutor(threads) as pool:
            while (batch := batches.get()) is not None:
                for done in as_completed([pool.submit(run_prompt, task, cfg) for task in batch]):
                    results.put(done.result())
        return

    def slot() -> None:
        while (batch := batches.get()) is not None:
            for task in batch:  # in order: the next prompt waits for the slowest so far
                results.put(run_prompt(task, cfg))

    pool = [threading.Thread(target=slot) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


class BatchLevelExecutor:
    """The baselines of (5): a slot runs a whole batch in order, or (barrier) a worker runs one batch at a time."""

    def __init__(self, cfg, num_workers: int, threads_per_worker: int, barrier: bool):
        self.cfg, self.num_workers, self.threads, self.barrier = cfg, num_workers, threads_per_worker, barrier

    def run(self, tasks, stop):
        import multiprocessing as mp
        from itertools import groupby

        ctx = mp.get_context("spawn")
        batches, results = ctx.Queue(), ctx.Queue()
        total = 0
        for _, group in groupby(tasks, key=lambda t: t.batch_num):
            batch = list(group)
            total += len(batch)
            batches.put(batch)
        procs = [
            ctx.Process(
                target=_batch_slot_main, args=(self.cfg, batches, results, self.threads, self.barrier), daemon=True
            )
            for _ in range(self.num_workers)
        ]
        for p in procs:
            p.start()
        for _ in range(self.num_workers * (1 if self.barrier else self.threads)):
            batches.put(None)
        for _ in range(total):
            yield results.get()
        for p in procs:
            p.join()


def batch_level_cli() -> None:
    """The real CLI with the batch-level executor in place of the prompt-level one."""
    import run_session
    from batch_runner import cli

    run_session._executor = lambda cfg, num_workers, concurrency, ray_address: BatchLevelExecutor(
        cfg, num_workers, -(-concurrency // num_workers), os.environ.get("BENCH_BATCH_MODE") == "barrier"
    )
    cli()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == BATCH_LEVEL_CLI:
        del sys.argv[1]
        batch_level_cli()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="1,2,3,4,5", help="comma-separated benchmark numbers (6 = Ray)")
    which = parser.parse_args().only.replace(",", "")
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "python": sys.version.split()[0]}
    results["machine"] = {"nproc": os.cpu_count(), "ram_gib": round(psutil.virtual_memory().total / GIB, 1)}
    print(f"machine: {results['machine']}, Python {results['python']}", flush=True)
    if "1" in which or "2" in which:
        bench_throughput(results, which)
    if "3" in which:
        bench_cpu(results)
    if "4" in which:
        bench_resume(results)
    if "5" in which:
        bench_scheduling(results)
    if "6" in which:
        bench_ray(results)
    (OUT / f"results_{time.strftime('%Y%m%d_%H%M%S')}.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
