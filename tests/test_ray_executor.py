"""RayExecutor on a local Ray instance: same outputs as the local executor, stop, and dead actors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripted_server import ScriptedServer  # noqa: E402

from agentbatch.model.client import ModelSettings  # noqa: E402
from agentbatch.tools.settings import ToolSettings  # noqa: E402
from agentbatch.work import RunConfig, SampleTask  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = [
    {"reasoning": "Look first.", "tool_calls": [{"name": "read_file", "arguments": {"path": "/etc/hostname"}}]},
    {"reasoning": "Now answer.", "content": "Answer to {prompt}"},
]


def run_cli(tmp_path: Path, name: str, base_url: str, *flags: str) -> subprocess.CompletedProcess:
    dataset = tmp_path / "prompts.jsonl"
    if not dataset.exists():
        prompts = [f"ray prompt {i}" for i in range(11)] + ["ray prompt 3"]
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    cmd = [
        sys.executable,
        str(ROOT / "batch_runner.py"),
        f"--dataset_file={dataset}",
        "--batch_size=5",
        f"--run_name={name}",
        f"--base_url={base_url}",
        "--api_key=sk-test-ray-executor",
        "--model=m",
        f"--output_dir={tmp_path}",
        "--distribution=balanced",
        "--seed=11",
        "--num_workers=2",
        "--concurrency=4",
        "--max_retries=0",
        # Prompts whose sampled toolsets lack read_file end partial without reasoning: keep them too.
        "--require_reasoning=false",
        *flags,
    ]
    return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)


def comparable(path: Path) -> list[dict]:
    """Trajectory lines without what legitimately differs between runs (timestamps, durations), in prompt order."""
    out = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record["metadata"].pop("timestamp")
        record.pop("duration_seconds")
        for check in record["checks"]:  # when each check ended: a time, as the line's timestamp is
            check.pop("checked_at")
        out.append(record)
    return sorted(out, key=lambda r: r["prompt_index"])


def test_cli_on_local_ray_matches_local_executor(tmp_path):
    with ScriptedServer(default_script=SCRIPT, latency=0.05) as srv:
        local = run_cli(tmp_path, "local", srv.base_url)
        on_ray = run_cli(tmp_path, "ray", srv.base_url, "--ray_address=local")
    assert local.returncode == 0, local.stderr[-3000:]
    assert on_ray.returncode == 0, on_ray.stderr[-3000:]
    a, b = comparable(tmp_path / "local" / "trajectories.jsonl"), comparable(tmp_path / "ray" / "trajectories.jsonl")
    assert [r["prompt_index"] for r in b] == list(range(12))
    assert a == b  # same prompts, same seeded toolsets, same conversations and statistics per line
    assert len({tuple(r["toolsets_used"]) for r in b}) > 1  # the seed really varied the toolsets
    sa = json.loads((tmp_path / "local" / "statistics.json").read_text())
    sb = json.loads((tmp_path / "ray" / "statistics.json").read_text())
    assert sb["prompts"] == sa["prompts"] == {"total": 12, "done": 12, "discarded": 0, "failed": 0, "not_run": 0}
    assert sb["tools"] == sa["tools"]


@pytest.fixture(scope="module")
def local_ray():
    """A Ray instance shared by the in-process tests; the executor joins it and leaves it running."""
    from agentbatch.executors import ray_actors as ray_executor

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"py_modules": ray_executor._project_modules()},
    )
    yield
    ray.shutdown()


def config(base_url: str) -> RunConfig:
    return RunConfig(
        run_name="ray-test",
        model=ModelSettings(model="m", base_url=base_url, api_key="sk-test", max_retries=0),
        tools=ToolSettings(),
        require_reasoning=False,
    )


def tasks(n: int, pulled: list[int]):
    for i in range(n):
        pulled.append(i)
        yield SampleTask(i, f"task {i}", 0, ["file"])


def test_stop_event_stops_dispatch(local_ray):
    from agentbatch.executors.ray_actors import RayExecutor

    stop = threading.Event()
    pulled: list[int] = []
    outcomes = []
    with ScriptedServer(default_script=SCRIPT, latency=0.3) as srv:
        executor = RayExecutor(config(srv.base_url), "local", num_workers=1, threads_per_worker=3)
        for outcome in executor.run(tasks(30, pulled), stop):
            outcomes.append(outcome)
            stop.set()
    # The three in flight when stop was set finish and are reported; nothing else was started.
    assert len(pulled) == 3
    assert sorted(o.index for o in outcomes) == [0, 1, 2]
    assert all(o.status == "done" for o in outcomes), [o.error for o in outcomes]
    assert ray.is_initialized()  # it joined the test's instance, so it left it running


def test_dead_actor_prompts_fail_and_a_new_actor_takes_over(local_ray):
    from agentbatch.executors.ray_actors import RayExecutor

    pulled: list[int] = []
    with ScriptedServer(default_script=SCRIPT, latency=1.5) as srv:
        executor = RayExecutor(config(srv.base_url), "local", num_workers=1, threads_per_worker=2)

        def kill_first_actor():
            while not executor.actors:
                time.sleep(0.05)
            pid = ray.get(executor.actors[0].pid.remote())
            while len(srv.requests()) < 2:  # kill it once both its prompts wait on the server
                time.sleep(0.05)
            os.kill(pid, signal.SIGKILL)

        killer = threading.Thread(target=kill_first_actor)
        killer.start()
        start = time.monotonic()
        outcomes = list(executor.run(tasks(6, pulled), threading.Event()))
        killer.join()
    assert time.monotonic() - start < 120
    assert sorted(o.index for o in outcomes) == list(range(6))  # every prompt reported exactly once
    failed = sorted(o.index for o in outcomes if o.status == "failed")
    assert failed == [0, 1]
    assert all("Ray actor died" in o.error for o in outcomes if o.status == "failed")
    assert all(o.status == "done" for o in outcomes if o.index >= 2)
