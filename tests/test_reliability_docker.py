"""Reliability: a run never touches another run's containers, and a container that vanishes fails its prompt.

Issue 18, item 3, through the real CLI, the scripted endpoint and the real Docker engine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import docker
import pytest
from cli_helpers import RunDir, assert_clean_exit, cli_command, cli_env, run_cli, write_dataset
from conftest_docker import RUN_LABEL
from scripted_server import ScriptedServer

from agentbatch.sandboxes.base import RUN_DIR_LABEL, SESSION_LABEL

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _no_leftover_containers(docker_run_name):
    """Every test ends with `docker ps -a` empty of its run's containers (docker_run_name asserts it)."""
    yield


def command_then_answer(command: str) -> list[dict]:
    return [{"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}, {"content": "all done"}]


def args_for(run_name: str, dataset, output_dir, image: str, *extra: str) -> list[str]:
    return [
        f"--dataset_file={dataset}",
        "--batch_size=10",
        f"--run_name={run_name}",
        f"--output_dir={output_dir}",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--max_retries=0",
        "--num_workers=1",
        "--sandbox=docker",
        f"--docker_image={image}",
        "--command_timeout=300",
        *extra,
    ]


def containers(run_name: str) -> list[dict]:
    """The run name's containers (all run directories), as the low-level list gives them: id and labels."""
    return docker.from_env().api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_name}"})


def start(args: list[str], server, log) -> subprocess.Popen:
    return subprocess.Popen(
        cli_command(args, server),
        cwd=log.parent,
        env=cli_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_container(run_name: str, proc: subprocess.Popen, log) -> dict:
    deadline = time.monotonic() + 120
    while not (found := containers(run_name)):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the prompt never got a container:\n{log.read_text()}")
        time.sleep(0.2)
    time.sleep(1)  # let its command start
    return found[0]


def wait_for_process(container_id: str, command: str) -> None:
    """Until `command` runs in the container (`docker top`)."""
    api = docker.from_env().api
    deadline = time.monotonic() + 60
    while not any(command in " ".join(row) for row in api.top(container_id).get("Processes") or []):
        assert time.monotonic() < deadline, f"{command!r} never started in the container"
        time.sleep(0.2)


def tool_result(record: dict) -> dict:
    return json.loads(next(t["value"] for t in record["conversations"] if t["from"] == "tool"))


def test_two_runs_with_one_run_name_in_two_output_dirs_leave_each_other_alone(tmp_path, docker_images, docker_run_name):
    image = docker_images[0]
    dataset = write_dataset(tmp_path / "rows.jsonl", ["long one"])
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    # The first prompt's command waits (at most 2 minutes) for a file the test creates once the second run is over.
    waits = "i=0; while [ ! -e /tmp/go ] && [ $i -lt 600 ]; do sleep 0.2; i=$((i+1)); done; echo first finished"
    with ScriptedServer(default_script=command_then_answer(waits)) as server:
        first = start(args_for(docker_run_name, dataset, first_dir, image), server, tmp_path / "first.log")
        try:
            mine = wait_for_container(docker_run_name, first, tmp_path / "first.log")
            labels = mine["Labels"]
            assert labels[RUN_DIR_LABEL] == os.path.realpath(first_dir / docker_run_name), labels
            assert labels[SESSION_LABEL], labels
            # The same run name elsewhere: a start that reaps must leave the first run's live container alone.
            with ScriptedServer(default_script=command_then_answer("echo second")) as other:
                second = run_cli(args_for(docker_run_name, dataset, second_dir, image), tmp_path, other)
            assert_clean_exit(second)
            assert "removed" not in second.stderr, second.stderr
            assert mine["Id"] in {c["Id"] for c in containers(docker_run_name)}, "the live container was removed"
            docker.from_env().containers.get(mine["Id"]).exec_run(["touch", "/tmp/go"])
            code = first.wait(timeout=120)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
    assert code == 0, (tmp_path / "first.log").read_text()
    [record] = RunDir(first_dir / docker_run_name).trajectories()
    result = tool_result(record)
    assert result["exit_code"] == 0 and result["output"] == "first finished\n", result
    [record] = RunDir(second_dir / docker_run_name).trajectories()
    assert tool_result(record)["output"] == "second\n"


def test_a_prompt_whose_container_vanishes_mid_command_fails_and_resume_reruns_it(
    tmp_path, docker_images, docker_run_name
):
    image = docker_images[0]
    dataset = write_dataset(tmp_path / "rows.jsonl", ["doomed"])
    args = args_for(docker_run_name, dataset, tmp_path / "out", image)
    run = RunDir(tmp_path / "out" / docker_run_name)
    with ScriptedServer(default_script=command_then_answer("sleep 300")) as server:
        proc = start(args, server, tmp_path / "run.log")
        try:
            victim = wait_for_container(docker_run_name, proc, tmp_path / "run.log")
            wait_for_process(victim["Id"], "sleep 300")
            docker.from_env().api.remove_container(victim["Id"], force=True)  # as another program might
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        asked = len(server.requests())
    assert code == 3, f"{(tmp_path / 'run.log').read_text()}\n{run.batch_records()}"
    assert not run.batch_records(), "a prompt whose sandbox vanished was saved as a sample"
    [failed] = run.failed()
    assert "was removed while the sample ran" in failed["error"], failed
    assert asked == 1, "the model was asked again after its sandbox was gone"

    with ScriptedServer(default_script=command_then_answer("echo again")) as server:
        again = run_cli([*args, "--resume"], tmp_path, server)
    assert_clean_exit(again)
    [record] = run.trajectories()
    assert tool_result(record)["output"] == "again\n"
