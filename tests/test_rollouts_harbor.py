"""Harbor task directories as a Python caller's tasks: each built, run in its container and checked by its
tests as in a CLI run (docs/harbor.md), the group's reward the verifier's; no container left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_helpers import RunDir

from agentbatch import Rollouts

pytestmark = pytest.mark.docker

TASKS = Path(__file__).parent / "harbor_tasks"


@pytest.fixture(scope="module")
def harbor_base(docker_images) -> str:
    """debian:bookworm-slim, which the test tasks build FROM (tests/build_debian_image.sh, idempotent)."""
    script = Path(__file__).parent / "build_debian_image.sh"
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"{script} failed: {done.stderr.strip() or done.stdout.strip()}")
    return "debian:bookworm-slim"


def test_harbor_task_directories_are_tasks_and_their_verifiers_give_the_rewards(tmp_path, harbor_base, docker_run_name):
    out = tmp_path / "out"
    with Rollouts(model="oracle", run_name=docker_run_name, output_dir=str(out), samples_per_prompt=2) as rollouts:
        groups = {g.index: g for g in rollouts.run([TASKS / "sum-numbers", str(TASKS / "broken-solution")])}
    assert sorted(groups) == [0, 1]
    assert [s.reward for s in groups[0].samples] == [1.0, 1.0]
    assert [s.reward for s in groups[1].samples] == [0.0, 0.0]
    assert groups[0].samples[0].record["task"]["name"] == "sum-numbers"
    assert len(RunDir(out / docker_run_name).trajectories()) == 4


def test_a_path_that_is_no_task_directory_is_named(tmp_path, docker_images):
    with Rollouts(model="oracle") as rollouts:
        with pytest.raises(Exception, match="task 0: .* is no task directory"):
            rollouts.run([str(tmp_path / "missing")])
