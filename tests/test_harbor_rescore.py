"""--rescore of runs in containers, through the real CLI and the real Docker engine (docs/replay.md): a Harbor task
whose tests were fixed after the run, and a row with an image whose verify changed, each checked again in a fresh
container holding what the sample changed in its own (files added and changed anywhere, files deleted)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from conftest_docker import IMAGE_ONE, leftover_containers
from scripted_server import ScriptedServer
from verify_helpers import answer, sh

pytestmark = pytest.mark.docker

TASKS = Path(__file__).parent / "harbor_tasks"
BASE_SCRIPT = Path(__file__).parent / "build_debian_image.sh"
# The agent's work: its answer in /app, a note outside the workdir, and the task's input deleted.
WORK = "echo 12 > /app/sum.txt && mkdir -p /opt/notes && echo hi > /opt/notes/n.txt && rm /app/numbers.txt"
TESTS = """#!/bin/bash
got=$(tr -d '[:space:]' < /app/{file} 2>/dev/null)
notes=$(cat /opt/notes/n.txt 2>/dev/null)
echo "{file} holds '$got', notes '$notes', numbers.txt $([ -e /app/numbers.txt ] && echo there || echo gone)"
if [ "$got" = {want} ] && [ "$notes" = hi ] && [ ! -e /app/numbers.txt ]; then r=1; else r=0; fi
echo "$r" > /logs/verifier/reward.txt
"""


@pytest.fixture(scope="session")
def harbor_base(docker_images) -> str:
    """debian:bookworm-slim, which the test tasks build FROM: made offline by debootstrap once per machine."""
    done = subprocess.run(["sh", str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"{BASE_SCRIPT} failed: {done.stderr.strip() or done.stdout.strip()}")
    return "debian:bookworm-slim"


def harbor_args(dataset, out, run_name: str, *extra: str) -> list[str]:
    return [
        f"--dataset_file={dataset}",
        "--batch_size=4",
        f"--run_name={run_name}",
        f"--output_dir={out}",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        *extra,
    ]


def test_a_harbor_task_whose_tests_were_fixed_is_scored_again_from_the_containers_kept_state(
    tmp_path, harbor_base, docker_run_name
):
    task = tmp_path / "tasks" / "sum-numbers"
    shutil.copytree(TASKS / "sum-numbers", task)
    tests = task / "tests" / "test.sh"
    tests.write_text(TESTS.format(file="result.txt", want=12))  # the bug: the task asks for sum.txt
    prompt = (task / "instruction.md").read_text()
    with ScriptedServer(script={prompt: [sh(WORK), answer("done")]}) as srv:
        args = harbor_args(tmp_path / "tasks", tmp_path / "out", docker_run_name, "--samples_per_prompt=2")
        done = run_cli([*args, "--keep_final_state"], tmp_path, srv)
    assert_clean_exit(done)
    run = RunDir(tmp_path / "out" / docker_run_name)
    first = run.trajectories()
    assert [r["passed"] for r in first] == [False, False]
    assert all("result.txt holds ''" in r["check"]["output"] for r in first)

    tests.write_text(TESTS.format(file="sum.txt", want=12))  # fixed
    done = run_cli([*harbor_args(tmp_path / "tasks", tmp_path / "out", docker_run_name), "--rescore"], tmp_path)
    assert_clean_exit(done)
    assert "2 samples checked again (2 now pass" in done.stdout
    fixed = run.trajectories()
    assert [r["passed"] for r in fixed] == [True, True]
    for line in fixed:
        assert line["check"]["output"].startswith("sum.txt holds '12', notes 'hi', numbers.txt gone")
        assert [c["passed"] for c in line["checks"]] == [False, True]
        assert line["check"]["rewards"] == [{"name": "reward", "value": 1.0}]
    stats = run.stats()["outcomes"]
    assert (stats["passed"], stats["by_category"]["data-processing"]["passed"]) == (2, 2)

    tests.write_text(TESTS.format(file="sum.txt", want=13))  # stricter again: no longer passes
    done = run_cli([*harbor_args(tmp_path / "tasks", tmp_path / "out", docker_run_name), "--rescore"], tmp_path)
    assert_clean_exit(done)
    assert "0 now pass, 2 no longer pass" in done.stdout
    assert [[c["passed"] for c in r["checks"]] for r in run.trajectories()] == [[False, True, False]] * 2
    assert leftover_containers(docker_run_name) == []


def test_a_row_in_an_image_has_its_changed_verify_run_on_what_its_container_changed(tmp_path, docker_run_name):
    rows = [{"prompt": "mark", "image": IMAGE_ONE, "verify": "test -f /srv/out.txt"}]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    script = {"mark": [sh("mkdir -p /srv && echo ok > /srv/done.txt && rm -f /bin/true"), answer("marked")]}
    with ScriptedServer(script=script) as srv:
        done = run_cli([*harbor_args(data, tmp_path / "out", docker_run_name), "--keep_final_state"], tmp_path, srv)
    assert_clean_exit(done)
    run = RunDir(tmp_path / "out" / docker_run_name)
    assert [r["passed"] for r in run.trajectories()] == [False]
    rows[0]["verify"] = "grep -qx ok /srv/done.txt && test ! -e /bin/true && echo replayed"
    write_dataset(tmp_path / "ds.jsonl", rows)
    done = run_cli([*harbor_args(data, tmp_path / "out", docker_run_name), "--rescore"], tmp_path)
    assert_clean_exit(done)
    (line,) = run.trajectories()
    assert (line["passed"], line["check"]["output"]) == (True, "replayed\n")
    assert leftover_containers(docker_run_name) == []
