"""What every benchmark shares: the scripted server in its own process, the CLI run with its process tree
sampled, datasets, and the report line with the machine's load beside each figure."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from tree_sampler import TreeSampler

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the scripted server is test and bench support

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
    """scripted_server.py in a separate process, or (asyncio=True) the same replies from bench/async_endpoint.py."""

    def __init__(
        self,
        latency: float,
        jitter: float = 0.0,
        heavy_tail: bool = False,
        seed: int = 0,
        asyncio: bool = False,
        script: list[dict] | None = None,
        extra: tuple[str, ...] = (),
    ):
        OUT.mkdir(parents=True, exist_ok=True)
        path = OUT / f"script_{os.getpid()}_{id(self)}.json"
        path.write_text(json.dumps(script or DEFAULT_SCRIPT))
        program = ROOT / ("bench/async_endpoint.py" if asyncio else "tests/scripted_server.py")
        cmd = [sys.executable, str(program), "--port", "0", "--default_script", str(path)]
        cmd += ["--latency", str(latency), "--jitter", str(jitter), "--seed", str(seed), *extra]
        if heavy_tail:
            cmd.append("--heavy_tail")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"scripted server did not start: {line!r}")
        self.base_url = line.split()[1]

    def timings(self) -> dict:
        """bench/async_endpoint.py's count of requests, first request and last reply (time.monotonic)."""
        return self.get("/_timings")

    def get(self, path: str) -> dict:
        """A JSON inspection route of the server (/_rate, /_requests, /_timings)."""
        root = self.base_url.rsplit("/v1", 1)[0]
        with urllib.request.urlopen(root + path, timeout=30) as r:
            return json.loads(r.read())

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


def run_cli(
    name: str,
    dataset: Path,
    base_url: str,
    *extra: str,
    entry: list[str] | None = None,
    env: dict | None = None,
    retries: int | None = 2,
    codes: tuple[int, ...] = (0,),
) -> dict:
    """The real CLI in a subprocess: wall time, peak tree RSS, CPU seconds of its processes, statistics.

    Run as a user would: with Python's bytecode cache, which this machine's PYTHONDONTWRITEBYTECODE=1 turns
    off (every start would compile the project's modules again, ~0.1 s). `retries` None leaves --max_retries
    at its default, as a new user would; `codes` are the exits accepted.
    """
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
        *([f"--max_retries={retries}"] if retries is not None else []),
        "--seed=1",
        # The figures measure the runner, not a sandbox: the local one, as when they were first taken
        # (bench_sandboxes.py measures what bwrap and docker add).
        *([] if any(e.startswith("--sandbox=") for e in extra) else ["--sandbox=local"]),
        *extra,
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, **(env or {})}
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    stdout, stderr = proc.communicate()
    ended = time.monotonic()
    wall = ended - start
    sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in codes:
        raise RuntimeError(f"{name}: exit {proc.returncode}\n{stderr[-3000:]}")
    stats = json.loads((runs / name / "statistics.json").read_text())
    return {
        "wall": wall,
        "peak_rss": sampler.peak,
        "peak_procs": sampler.peak_procs,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "exit": proc.returncode,
        "failed_lines": _lines(runs / name / "failed.jsonl"),
        "samples": stats["samples"],
        "api_calls": stats["api_calls"],
        "run_seconds": stats["duration_seconds"],
        "cpu_parent_seen": sampler.cpu.get(proc.pid, 0.0),
        "cpu_others_seen": sum(v for k, v in sampler.cpu.items() if k != proc.pid),
        "sampler_cpu": sampler.spent,  # the measuring's own, on the same cores
        "loadavg": os.getloadavg(),
        "started": start,
        "ended": ended,
    }


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(results: dict, key: str, line: str) -> None:
    line += f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    print(line, flush=True)
    results.setdefault("lines", []).append(line)


def check_all_done(name: str, r: dict, n: int, calls: int = CALLS_PER_PROMPT) -> None:
    if r["samples"]["done"] != n or r["api_calls"] != n * calls:
        raise RuntimeError(f"{name}: expected {n} prompts done with {n * calls} calls, got {r}")
