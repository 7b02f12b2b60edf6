"""(12) Sandbox starts paced apart from prompts, against the engine's own best parallelism, in one run.

The engine: 200 containers created, started and removed through the docker SDK, as the runner configures
them, by 1, 2, 4 ... 32 threads at once; the best of those times is the engine's own. The runner: the real CLI,
200 prompts each running one terminal command in its own Docker sandbox at --concurrency=64, with the default
limit on sandboxes created at once and with the limit lifted (--sandbox_starts=64, every prompt starting its
container when it likes). Target: the runner's wall time within 1.3x the engine's best.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from common import OUT, ROOT, Server, report, run_cli

N, CONCURRENCY = 200, 64
IMAGE = "br-test-busybox:1"  # built from busybox-static by tests/build_test_image.sh: no pull, no network
SCRIPT = [
    {"reasoning": "Run it.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo hello"}}]},
    {"reasoning": "It ran.", "content": "It printed hello."},
]
PARALLELISM = (1, 2, 4, 8, 16, 32)


def _engine(parallel: int, label: str) -> float:
    """Seconds to create, start and remove N containers, `parallel` at a time, as the runner makes them."""
    import docker

    from agentbatch.sandboxes.base import RUN_LABEL
    from agentbatch.sandboxes.docker_container import KEEPALIVE

    client = docker.from_env(timeout=120)

    def one(i: int) -> None:
        c = client.containers.create(
            IMAGE,
            entrypoint=KEEPALIVE,
            command=[],
            name=f"br-bench-{label}-{i}",
            labels={RUN_LABEL: label},
            detach=True,
            mem_limit="1g",
            memswap_limit="1g",
            nano_cpus=10**9,
            pids_limit=256,
        )
        c.start()
        client.api.remove_container(c.id, force=True, v=True)

    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(N)))
    return time.monotonic() - start


def _dataset() -> str:
    path = OUT / f"docker_prompts_{N}.jsonl"
    with open(path, "w") as f:
        for i in range(N):
            f.write(json.dumps({"prompt": f"Sandbox task {i}: run one command.", "image": IMAGE}) + "\n")
    return path


def bench_sandbox_starts(results: dict) -> None:
    """(12) the engine at each parallelism, then the runner with and without its start limit."""
    subprocess.run(["sh", str(ROOT / "tests" / "build_test_image.sh")], check=True, capture_output=True)
    engine = {}
    for p in PARALLELISM:
        engine[p] = _engine(p, f"engine-{uuid.uuid4().hex[:8]}")
        report(
            results,
            "sandbox_starts",
            f"(12) engine: {N} containers created, started and removed {p} at a time: {engine[p]:.1f} s",
        )
    best_p = min(engine, key=engine.get)
    best = engine[best_p]
    runs = {}
    dataset = _dataset()
    for label, flags in (("default limit", ()), ("no limit (--sandbox_starts=64)", ("--sandbox_starts=64",))):
        with Server(latency=0.0, script=SCRIPT) as srv:
            name = f"starts_{uuid.uuid4().hex[:8]}"
            r = run_cli(
                name,
                dataset,
                srv.base_url,
                "--num_workers=2",
                f"--concurrency={CONCURRENCY}",
                "--sandbox=docker",
                "--distribution=terminal_only",
                *flags,
                codes=(0, 3),
            )
        runs[label] = r
        errors = sorted({f["error"][:80] for f in r["failed_lines"]})
        report(
            results,
            "sandbox_starts",
            f"(12) runner, {label}: {N} prompts with one command each in Docker sandboxes, concurrency {CONCURRENCY}: "
            f"{r['samples']['failed']} failed {errors}; wall {r['wall']:.1f} s (run phase {r['run_seconds']:.1f} s) = "
            f"{r['wall'] / best:.2f}x the engine's best ({best:.1f} s at {best_p} at a time) "
            f"[target <= 1.3: {'met' if r['wall'] <= 1.3 * best and not r['samples']['failed'] else 'NOT met'}]",
        )
    results["sandbox_starts"] = {"engine": engine, "best_parallelism": best_p, "runs": runs, "cores": os.cpu_count()}
