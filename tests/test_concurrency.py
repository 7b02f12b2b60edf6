"""High concurrency through the real CLI: many samples in flight, each sample run exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripted_server import ScriptedServer  # noqa: E402

LATENCY = 0.5
SCRIPT = [
    {"reasoning": "Check the file.", "tool_calls": [{"name": "read_file", "arguments": {"path": "/etc/hostname"}}]},
    {"reasoning": "Answer.", "content": "Answer to {prompt}"},
]


def run_cli(tmp_path: Path, base_url: str, n: int, *flags: str) -> tuple[subprocess.CompletedProcess, float]:
    dataset = tmp_path / "prompts.jsonl"
    # Two copies of one prompt: each must be run once, not once in total.
    prompts = [f"concurrency prompt {i}" for i in range(n - 1)] + ["concurrency prompt 0"]
    dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cmd = [
        sys.executable,
        str(ROOT / "batch_runner.py"),
        f"--dataset_file={dataset}",
        "--batch_size=25",
        "--run_name=conc",
        f"--base_url={base_url}",
        "--api_key=sk-test-concurrency",
        "--model=m",
        f"--output_dir={tmp_path}",
        "--distribution=terminal_only",
        "--max_retries=0",
        *flags,
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    return proc, time.monotonic() - start


@pytest.mark.slow
def test_high_concurrency_is_far_faster_than_serial_and_runs_each_prompt_once(tmp_path):
    n = 256
    with ScriptedServer(default_script=SCRIPT, latency=LATENCY, jitter=0.2) as srv:
        proc, wall = run_cli(tmp_path, srv.base_url, n, "--num_workers=2", "--concurrency=64")
        requests = srv.requests()
    assert proc.returncode == 0, proc.stderr[-3000:]
    serial = n * len(SCRIPT) * LATENCY  # 256 s one prompt at a time
    ideal = serial / 64  # 4 s
    # Generous: startup of three interpreters and other load on the machine; still ~10x faster than serial.
    assert wall < serial / 8, f"{wall:.1f} s for {n} prompts (ideal {ideal:.1f} s, serial {serial:.0f} s)"

    lines = [json.loads(x) for x in (tmp_path / "conc" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(r["prompt_index"] for r in lines) == list(range(n))
    asked = Counter(r["conversations"][0]["value"] for r in lines)
    assert asked["concurrency prompt 0"] == 2 and set(asked.values()) == {1, 2} and len(asked) == n - 1
    assert all(r["completed"] and r["api_calls"] == 2 for r in lines)
    assert len(requests) == n * len(SCRIPT)  # no prompt was started twice
    stats = json.loads((tmp_path / "conc" / "statistics.json").read_text())
    assert stats["prompts"] == {"total": n, "done": n, "discarded": 0, "failed": 0, "not_run": 0}
    assert not (tmp_path / "conc" / "failed.jsonl").exists() or not (tmp_path / "conc" / "failed.jsonl").read_text()


@pytest.mark.slow
def test_concurrency_bounds_prompts_in_flight(tmp_path):
    """--concurrency=4 over 2 workers: never more than 4 model calls at the endpoint at once."""
    n, latency = 24, 0.4
    with ScriptedServer(default_script=SCRIPT, latency=latency) as srv:
        proc, wall = run_cli(tmp_path, srv.base_url, n, "--num_workers=2", "--concurrency=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 48 calls of 0.4 s: at 4 in flight no faster than 4.8 s; at 5 or more it could take 3.9 s or less.
    assert wall >= n * len(SCRIPT) * latency / 4
    assert wall < 60
