"""Harbor task directories through the real CLI and the real Docker engine (docs/harbor.md): images built
from environment/, the oracle's reference solutions, the task's container and limits, the verifier's
rewards, a build that fails, an agent that looks for the tests, resume of an edited task, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import docker
import pyarrow.parquet as pq
import pytest
from cli_helpers import RunDir, run_cli
from scripted_server import ScriptedServer
from verify_helpers import answer, sh

pytestmark = pytest.mark.docker

TASKS = Path(__file__).parent / "harbor_tasks"
BASE_SCRIPT = Path(__file__).parent / "build_debian_image.sh"


@pytest.fixture(scope="session")
def harbor_base(docker_images) -> str:
    """debian:bookworm-slim, which the test tasks build FROM: made offline by debootstrap once per machine."""
    done = subprocess.run(["sh", str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"{BASE_SCRIPT} failed: {done.stderr.strip() or done.stdout.strip()}")
    return "debian:bookworm-slim"


def task_set(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "tasks"
    for name in names:
        shutil.copytree(TASKS / name, root / name, symlinks=True)
    return root


def harbor_args(dataset, out, run_name: str, *extra: str) -> list[str]:
    return [f"--dataset_file={dataset}", "--batch_size=4", f"--run_name={run_name}", f"--output_dir={out}", *extra]


def by_task(lines: list[dict]) -> dict[str, dict]:
    return {r["task"]["name"]: r for r in lines}


def rewards(line: dict) -> dict[str, float]:
    """A line's check.rewards (a list of name/value pairs, one shape for every line) as a dict."""
    return {r["name"]: r["value"] for r in line["check"]["rewards"]}


def test_an_oracle_run_passes_or_names_each_task_and_needs_no_endpoint(tmp_path, harbor_base, docker_run_name):
    done = run_cli(harbor_args(TASKS, tmp_path / "out", docker_run_name, "--model=oracle"), tmp_path)

    assert done.returncode == 3, done.stderr  # bad-build's samples failed; nothing else did
    run = RunDir(tmp_path / "out" / docker_run_name)
    lines = by_task(run.trajectories())
    assert sorted(lines) == ["broken-solution", "peek", "slow-verifier", "sum-numbers", "tests/partial-credit"]
    ok = lines["sum-numbers"]
    assert (ok["passed"], ok["reward"], ok["check"]["status"], ok["check"]["rewards"]) == (
        True,
        1.0,
        "passed",
        [{"name": "reward", "value": 1.0}],
    )
    assert "working directory /app" in ok["check"]["output"]  # [environment] workdir
    image = ok["task"].pop("image")
    assert ok["task"].pop("image_id") == docker.from_env().images.get(image).id  # the image it ran in
    assert image.startswith("br-harbor/sum-numbers:")
    assert ok["task"] == {
        "name": "sum-numbers",
        "difficulty": "easy",
        "category": "data-processing",
        "tags": ["bash", "arithmetic"],
    }
    calls = [c for t in ok["conversations"] if t["from"] == "gpt" for c in t.get("tool_calls") or []]
    assert [json.loads(c["arguments"])["command"] for c in calls] == ["/solution/solve.sh"]
    assert any(t["from"] == "tool" and "wrote 12" in t["value"] for t in ok["conversations"])
    assert ok["usage"]["total_tokens"] == 0 and ok["metadata"]["model"] == "oracle"
    partial = lines["tests/partial-credit"]
    assert (partial["passed"], partial["reward"]) == (False, 0.6667)  # partial credit counts, but not as a pass
    # Every named number of reward.json is kept; its text field is not a reward.
    assert rewards(partial) == {"reward": 0.6667, "files_found": 2.0, "files_expected": 3.0}
    assert partial["check"]["output"] == "found 2 of 3 files\n"  # [verifier] env EXPECTED=3 reached test.sh
    assert (lines["broken-solution"]["passed"], lines["broken-solution"]["reward"]) == (False, 0.0)
    slow = lines["slow-verifier"]
    assert (slow["check"]["status"], slow["reward"], slow["passed"]) == ("timeout", None, None)
    assert slow["check"]["output"] == "verifying slowly\n"

    [failed] = run.failed()  # the build that fails: its log's tail, and no token spent
    assert failed["task"]["name"] == "bad-build" and failed["usage"]["total_tokens"] == 0
    assert "returned a non-zero code: 3" in failed["error"] and "installing the impossible" in failed["error"]

    out = done.stdout
    assert "oracle: 2 of 6 tasks pass with their reference solution (33.3%)" in out
    for line in (
        "    bad-build: image build failed: The command",
        "    broken-solution: not passed (reward 0)",
        "    slow-verifier: the tests ran past the verifier's timeout",
        "    tests/partial-credit: not passed (reward 0.6667)",
    ):
        assert line in out
    assert "unknown field [verifier] restart_environment ignored (broken-solution)" in done.stderr
    assert "docker rmi $(docker images -q --filter label=batch_runner.run_dir=" in done.stderr

    o = run.stats()["outcomes"]
    assert (o["by_category"]["data-processing"]["checked"], o["by_category"]["data-processing"]["passed"]) == (2, 1)
    assert (o["by_difficulty"]["easy"]["checked"], o["by_difficulty"]["hard"]["timeout"]) == (3, 1)
    assert "  category" in out and "  difficulty" in out


def test_a_model_sees_the_tasks_container_and_never_the_tests_or_the_solution(tmp_path, harbor_base, docker_run_name):
    data = task_set(tmp_path, "sum-numbers", "peek")
    toml = data / "sum-numbers" / "task.toml"
    toml.write_text(toml.read_text().replace("cpus = 1", "cpus = 64"))  # more than this machine has
    probe = (
        "ls /tests /solution 2>&1; ls /sys/class/net; pwd; "
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max; "
        'echo "mode=$TASK_MODE"; '
        "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null || cut -d' ' -f1 /sys/fs/cgroup/cpu.max"
    )
    script = {
        (TASKS / "sum-numbers" / "instruction.md").read_text(): [sh(probe), answer("I looked around.")],
        (TASKS / "peek" / "instruction.md").read_text(): [
            sh("cat /tests/test.sh /solution/solve.sh > /app/leaked.txt 2>&1; cat /app/leaked.txt"),
            answer("done"),
        ],
    }
    with ScriptedServer(script=script) as srv:
        flags = ("--require_reasoning=false", "--max_retries=0", "--require_pass")
        done = run_cli(harbor_args(data, tmp_path / "out", docker_run_name, *flags), tmp_path, server=srv)

    assert done.returncode == 0, done.stderr
    run = RunDir(tmp_path / "out" / docker_run_name)
    # --require_pass: the failing task's sample is discarded, the passing one kept.
    assert [(r["task"]["name"], r["discard_reason"]) for r in run.discarded()] == [("sum-numbers", "check_failed")]
    lines = by_task(run.trajectories() + run.discarded())
    seen = next(t["value"] for t in lines["sum-numbers"]["conversations"] if t["from"] == "tool")
    output = json.loads(seen)["output"]
    assert "ls: cannot access '/tests': No such file or directory" in output
    assert "ls: cannot access '/solution': No such file or directory" in output
    # No network, the workdir, memory_mb, [environment] env, and every CPU of the machine (not 64).
    quota = str((os.cpu_count() or 1) * 100_000)
    assert output.split("\n")[2:7] == ["lo", "/app", str(512 * 1024 * 1024), "mode=graded", quota]
    # A failing task: the agent did not write the sum.
    assert (lines["sum-numbers"]["passed"], lines["sum-numbers"]["reward"]) == (False, 0.0)
    peek = lines["peek"]
    leaked = json.loads(next(t["value"] for t in peek["conversations"] if t["from"] == "tool"))["output"]
    assert "SECRET" not in leaked and "No such file or directory" in leaked
    assert peek["passed"] is True  # what it copied held nothing of the tests


def test_the_tasks_timeouts_scale_and_a_lower_flag_given_wins(tmp_path, harbor_base, docker_run_name):
    root = task_set(tmp_path, "slow-verifier")
    task = root / "slow-verifier"
    (task / "task.toml").write_text(
        (task / "task.toml").read_text().replace("timeout_sec = 3.0", "timeout_sec = 100.0")
        + "\n[agent]\ntimeout_sec = 200.0\n"
    )
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 6\necho 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 60\n")
    out = tmp_path / "out"

    # 200 s × 0.01: the agent's 2 s cut the solution; 100 s × 0.01: the 1 s verifier timeout cut the tests.
    scaled = run_cli(harbor_args(root, out, docker_run_name, "--model=oracle", "--timeout_multiplier=0.01"), tmp_path)
    assert scaled.returncode == 0, scaled.stderr
    [line] = RunDir(out / docker_run_name).trajectories()
    assert (line["stop_reason"], line["partial"], line["check"]["status"]) == ("time", True, "timeout")

    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    shutil.rmtree(out)
    unscaled = run_cli(harbor_args(root, out, docker_run_name, "--model=oracle"), tmp_path)
    [line] = RunDir(out / docker_run_name).trajectories()
    assert (line["stop_reason"], line["check"]["status"]) == ("answered", "passed"), unscaled.stderr

    shutil.rmtree(out)
    lowered = run_cli(harbor_args(root, out, docker_run_name, "--model=oracle", "--check_timeout=1"), tmp_path)
    [line] = RunDir(out / docker_run_name).trajectories()
    assert line["check"]["status"] == "timeout", lowered.stderr


def test_an_edited_task_runs_again_on_resume_and_the_others_do_not(tmp_path, harbor_base, docker_run_name):
    root = task_set(tmp_path, "sum-numbers", "partial-credit")
    out = tmp_path / "out"
    first = run_cli(harbor_args(root, out, docker_run_name, "--model=oracle"), tmp_path)
    assert first.returncode == 0, first.stderr
    test = root / "partial-credit" / "tests" / "test.sh"
    test.write_text(test.read_text().replace('"$EXPECTED"', "2"))  # now two files are full marks

    again = run_cli(harbor_args(root, out, docker_run_name, "--model=oracle", "--resume"), tmp_path)

    assert again.returncode == 0, again.stderr
    assert "2 prompts, 1 already done, 1 to run" in again.stderr
    lines = RunDir(out / docker_run_name).trajectories()
    assert sorted(r["task"]["name"] for r in lines) == ["sum-numbers", "tests/partial-credit", "tests/partial-credit"]
    versions = [r for r in lines if r["task"]["name"] == "tests/partial-credit"]
    newest = max(versions, key=lambda r: r["metadata"]["batch_num"])  # the merge may lead with any line
    assert rewards(newest)["files_expected"] == 2.0
    # The oracle's verdict is on the tasks as they are now: the old version's partial credit is not counted.
    assert "oracle: 2 of 2 tasks pass with their reference solution (100.0%)" in again.stdout


def prebuilt_task(root: Path, name: str, image: str) -> Path:
    """A task without environment/: its [environment] docker_image is used as is."""
    task = root / name
    (task / "tests").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "instruction.md").write_text(f"Task {name}: nothing to do.\n")
    (task / "task.toml").write_text(f'version = "2.0"\n[environment]\ndocker_image = "{image}"\n')
    (task / "tests" / "test.sh").write_text("test -f /etc/debian_version && echo 1 > /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text("true\n")
    return task


def test_bad_tasks_are_skipped_or_failed_with_one_line_reasons(tmp_path, harbor_base, docker_run_name):
    root = task_set(tmp_path, "sum-numbers", "peek", "partial-credit")
    (root / "peek" / "environment" / "Dockerfile").write_text("FROM br-test-absent:nope\n")
    os.remove(root / "sum-numbers" / "tests" / "test.sh")
    shutil.copytree(TASKS / "partial-credit", root / "no-toml")
    os.remove(root / "no-toml" / "task.toml")
    # A Compose file that reaches beyond the sample: refused at load (the Compose tasks that run: test_harbor_compose).
    compose = "services:\n  main: {}\n  db:\n    image: br-test-busybox:1\n    ports: ['5432:5432']\n"
    (root / "partial-credit" / "environment" / "docker-compose.yaml").write_text(compose)
    prebuilt_task(root, "prebuilt", harbor_base)
    prebuilt_task(root, "prebuilt-absent", "br-test-absent:gone")
    os.remove(prebuilt_task(root, "no-solution", harbor_base) / "solution" / "solve.sh")

    done = run_cli(harbor_args(root, tmp_path / "out", docker_run_name, "--model=oracle"), tmp_path)

    assert done.returncode == 3, done.stderr
    assert "no-toml: skipped: not a task directory: no task.toml" in done.stderr
    assert "sum-numbers: skipped: no tests/test.sh: the task has no verifier" in done.stderr
    assert (
        "partial-credit: skipped: environment/docker-compose.yaml: service 'db' publishes a port on this machine"
        in done.stderr
    )
    run = RunDir(tmp_path / "out" / docker_run_name)
    assert [(r["task"]["name"], r["passed"]) for r in run.trajectories()] == [("prebuilt", True)]
    failed = {r["task"]["name"]: r["error"] for r in run.failed()}
    assert failed["peek"].startswith("FROM image 'br-test-absent:nope' is not on this machine and could not be pulled")
    assert failed["peek"].endswith("it must be present (docker pull, load or import) or pullable")
    assert failed["prebuilt-absent"].startswith(
        "Docker image 'br-test-absent:gone' is not here and could not be pulled"
    )
    assert failed["no-solution"] == "no solution/solve.sh: the task has no reference solution for the oracle to run"
    assert all("\n" not in e for e in failed.values())
    assert all(r["usage"]["total_tokens"] == 0 for r in run.failed())


def test_the_readmes_example_task_set_passes_with_the_oracle(tmp_path, harbor_base, docker_run_name):
    example = Path(__file__).resolve().parents[1] / "data" / "harbor_example"
    args = harbor_args(example, tmp_path / "out", docker_run_name, "--model=oracle", "--export=openai,parquet")
    done = run_cli(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "oracle: 3 of 3 tasks pass with their reference solution (100.0%)" in done.stdout
    run_dir = tmp_path / "out" / docker_run_name
    lines = by_task(RunDir(run_dir).trajectories())
    # The exports keep each line's task and named rewards.
    exported = [json.loads(x) for x in (run_dir / "export" / "openai" / "data.jsonl").read_text().splitlines()]
    assert sorted(x["task"]["category"] for x in exported) == ["debugging", "text-processing", "text-processing"]
    table = pq.read_table(run_dir / "export" / "parquet" / "data").to_pylist()
    assert sorted(r["task"]["name"] for r in table) == ["batch-runner/word-stats", "count-errors", "fix-the-script"]
    assert rewards(lines["batch-runner/word-stats"]) == {
        "reward": 1.0,
        "lines": 1.0,
        "words": 1.0,
        "longest": 1.0,
    }


def test_an_oracle_run_of_a_jsonl_dataset_is_refused(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    done = run_cli(harbor_args(data, tmp_path / "out", "r", "--model=oracle"), tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: --model=oracle runs Harbor tasks")
