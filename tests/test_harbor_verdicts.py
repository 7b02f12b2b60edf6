"""Harbor's verdicts through the real CLI and the real Docker engine (docs/harbor.md): what a reward file may
promote, what the oracle says of a solution that crashed, breakdowns that add up, one shape of rewards that
`datasets` loads, an agent that tries to stand in for the verifier, warnings said once per run, and a task
set's own text kept from the terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from cli_helpers import RunDir, run_cli
from scripted_server import ScriptedServer
from verify_helpers import answer, sh

pytestmark = pytest.mark.docker

BASE_SCRIPT = Path(__file__).parent / "build_debian_image.sh"
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\n"
ESC = "\x1b"


@pytest.fixture(scope="module")
def harbor_base(docker_images) -> str:
    done = subprocess.run(["sh", str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return "debian:bookworm-slim"


@pytest.fixture
def out(tmp_path):
    """The output directory; the images the test's runs built are removed after it."""
    path = tmp_path / "out"
    yield path
    engine = docker.from_env()
    for image in engine.images.list(filters={"label": "batch_runner.harbor"}):
        if str(image.labels.get("batch_runner.run_dir", "")).startswith(str(path)):
            engine.images.remove(image.id, force=True)


def task(root: Path, name: str, test_sh: str, solve_sh: str = "true\n", toml: str = "", instruction: str = "") -> Path:
    """A task directory: its test.sh and solve.sh, its task.toml's own lines after a [metadata]-less header."""
    path = root / name
    for sub in ("environment", "tests", "solution"):
        (path / sub).mkdir(parents=True)
    (path / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (path / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (path / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve_sh)
    (path / "instruction.md").write_text(instruction or f"Task {name}: do what the tests want.\n")
    (path / "task.toml").write_text('version = "2.0"\n' + toml)
    return path


def reward_json(text: str) -> str:
    return f"cat > /logs/verifier/reward.json <<'EOF'\n{text}\nEOF\n"


def cli(root: Path, out: Path, run_name: str, *extra: str, server=None):
    args = [f"--dataset_file={root}", "--batch_size=20", f"--run_name={run_name}", f"--output_dir={out}", *extra]
    return run_cli(args, root.parent, server=server)


def test_the_oracles_verdicts_rewards_and_breakdowns(tmp_path, out, harbor_base, docker_run_name):
    root = tmp_path / "tasks"
    cat = '[metadata]\ncategory = "text"\ndifficulty = "easy"\n'
    task(root, "passes", "echo 1 > /logs/verifier/reward.txt\n", toml='flavour = "odd"\n' + cat)
    task(
        root,
        "two-rewards",
        reward_json('{"reward": 1.0, "accuracy": 0.5, "note": "text"}'),
        toml='flavour = "odd"\n',
    )
    # A reward.json whose "reward" is no finite number is no result, whatever else it holds: never a pass.
    task(root, "nan-reward", reward_json('{"reward": NaN, "accuracy": 1.0}'))
    task(root, "text-reward", reward_json('{"reward": "0", "accuracy": 1.0}'))
    task(root, "false-reward", reward_json('{"reward": false, "accuracy": 1.0}'))
    task(root, "huge-reward", reward_json('{"reward": 1' + "0" * 400 + "}"))
    task(root, "huge-txt", "printf '1%0400d' 0 > /logs/verifier/reward.txt\n")
    # The reference solution crashes: the verdict says so, apart from the tests' own failure.
    crash = "sed -i s/a/b/ /solution/x.sh\n"
    task(root, "crashed-solution", "echo 0 > /logs/verifier/reward.txt\n", crash, toml=cat)
    # Harbor 1.4's fields are known, and applied where they can be: its collect hooks run before the tests
    # (one that fails is noted); a number no sample could use refuses its task at load.
    hooks = (
        '[[verifier.collect]]\ncommand = "echo snapshot > /app/collected"\n'
        '[[verifier.collect]]\ncommand = "echo no-db; exit 4"\ntimeout_sec = 10\n'
    )
    task(
        root,
        "one-four",
        "grep -qx snapshot /app/collected && echo 1 > /logs/verifier/reward.txt\n",
        toml='artifacts = ["/app/x"]\n[verifier]\nenvironment_mode = "shared"\n' + hooks,
    )
    task(root, "slow-build", "echo 1 > /logs/verifier/reward.txt\n", toml="[environment]\nbuild_timeout_sec = 1e10\n")
    # A task set's own text (a name, a category) never reaches the terminal as escapes.
    evil = '[task]\nname = "evil\\u001b]0;pwned\\u0007\\u001b[2J"\n[metadata]\ncategory = "red\\u001b[31m"\n'
    task(root, "evil", "echo 0 > /logs/verifier/reward.txt\n", toml=evil)

    done = cli(root, out, docker_run_name, "--model=oracle", "--export=parquet")

    assert done.returncode == 0, done.stderr
    run = RunDir(out / docker_run_name)
    lines = {r["task"]["name"]: r for r in run.trajectories()}
    for name in ("nan-reward", "text-reward", "false-reward", "huge-reward", "huge-txt"):
        assert (lines[name]["check"]["status"], lines[name]["passed"], lines[name]["reward"]) == ("error", None, None)
    assert 'reward.json\'s "reward" is NaN, not a finite number' in lines["nan-reward"]["check"]["output"]
    assert 'reward.json\'s "reward" is "0", not a finite number' in lines["text-reward"]["check"]["output"]
    assert (
        'reward.json\'s "reward" is a 401-digit integer, not a finite number' in lines["huge-reward"]["check"]["output"]
    )
    assert run.failed() == []  # none of them an internal error
    # check.rewards has one shape on every line, whatever a task names its rewards.
    assert lines["two-rewards"]["check"]["rewards"] == [
        {"name": "reward", "value": 1.0},
        {"name": "accuracy", "value": 0.5},
    ]
    assert lines["passes"]["check"]["rewards"] == [{"name": "reward", "value": 1.0}]
    assert lines["one-four"]["passed"] is True
    assert lines["one-four"]["check"]["output"] == "[collect hook 'echo no-db; exit 4' exited with 4: no-db]\n"

    verdict = done.stdout[done.stdout.index("oracle: ") :]
    assert (
        "    crashed-solution: solve.sh exited with 2: sed: can't read /solution/x.sh: No such file or directory; "
        "the tests: not passed (reward 0)"
    ) in verdict
    assert "    nan-reward: the tests gave no result: " in verdict

    err = done.stderr
    assert "slow-build: skipped: [environment] build_timeout_sec must be a positive number up to 604800" in err
    assert err.count("unknown field 'flavour' ignored") == 1  # one line for the field, naming its tasks
    assert "unknown field 'flavour' ignored (passes, two-rewards)" in err
    assert err.count("unknown field") == 1
    assert "is not applied" not in err  # artifacts: collected now; skills_dir: listed in the prompt
    assert ESC not in done.stdout + err and "evil\\x1b]0;pwned\\x07\\x1b[2J" in done.stdout + err

    o = run.stats()["outcomes"]
    # Tasks without a category or difficulty are the "none" row: each breakdown adds up to what was checked.
    assert (o["by_category"]["none"]["checked"], o["by_category"]["text"]["checked"]) == (7, 2)
    assert set(o["by_difficulty"]) == {"easy", "none"}
    for key in ("by_category", "by_difficulty"):
        assert sum(f["checked"] for f in o[key].values()) == o["checked"] == 10
    assert any(row.split()[:2] == ["none", "7"] for row in done.stdout.splitlines())
    # The five unreadable rewards count as not passed: 3 passes of 10 checks.
    assert (o["passed"], o["error"], o["pass_rate"]) == (3, 5, 0.3)

    # The real `datasets` loads both the lines and the Parquet export, rewards of every name in one column.
    from datasets import load_dataset

    cache = str(tmp_path / "hf-cache")
    lines_ds = load_dataset(
        "json", data_files=str(out / docker_run_name / "trajectories.jsonl"), split="train", cache_dir=cache
    )
    assert sorted(len(r["rewards"] or []) for r in lines_ds["check"]) == [0, 0, 0, 0, 0, 1, 1, 1, 1, 2]
    parquet = load_dataset(
        "parquet", data_dir=str(out / docker_run_name / "export" / "parquet" / "data"), split="train", cache_dir=cache
    )
    extra = [json.loads(x)["check"]["rewards"] for x in parquet["extra"]]
    assert [{"name": "reward", "value": 1.0}, {"name": "accuracy", "value": 0.5}] in extra
    assert {r["name"] for r in parquet["task"]} == set(lines)

    # A second session of the run says nothing more about the fields: once per run.
    again = cli(root, out, docker_run_name, "--model=oracle", "--resume")
    assert again.returncode == 0, again.stderr
    assert "is not applied" not in again.stderr and "slow-build: skipped" in again.stderr


def test_an_agent_cannot_stand_in_for_the_verifier(tmp_path, out, harbor_base, docker_run_name):
    root = tmp_path / "tasks"
    honest = "grep -qx done /app/state 2>/dev/null && r=1 || r=0; echo $r > /logs/verifier/reward.txt\n"
    fails = "echo 0 > /logs/verifier/reward.txt; sleep 2; echo tests-ran\n"
    tasks = {
        "honest": (honest, [sh("echo done > /app/state"), answer("done")]),
        # A `bash` of its own first on PATH: the tests run with the image's bash.
        "fake-bash": (
            fails,
            [
                sh(
                    "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /usr/local/bin/bash; chmod +x /usr/local/bin/bash"
                ),
                answer("done"),
            ],
        ),
        # A loop left running that writes the reward during the check: ended before the check starts.
        "loop": (
            fails,
            [
                sh(
                    "setsid sh -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                    "sleep 0.1; done' > /dev/null 2>&1 < /dev/null & echo started"
                ),
                answer("done"),
            ],
        ),
        # A check made to give no result is not a pass, and shows as such in the pass rate.
        "sabotage": (fails, [sh("rm -rf /logs; echo x > /logs"), answer("done")]),
    }
    script = {}
    for name, (test_sh, replies) in tasks.items():
        instruction = f"Task {name}: do what the tests want.\n"
        task(root, name, test_sh, instruction=instruction)
        script[instruction] = replies
    with ScriptedServer(script=script) as srv:
        done = cli(root, out, docker_run_name, "--require_reasoning=false", "--max_retries=0", server=srv)

    assert done.returncode == 0, done.stderr
    run = RunDir(out / docker_run_name)
    lines = {r["task"]["name"]: r for r in run.trajectories()}
    assert (lines["honest"]["passed"], lines["honest"]["reward"]) == (True, 1.0)
    for name in ("fake-bash", "loop"):
        assert (lines[name]["passed"], lines[name]["reward"]) == (False, 0.0), lines[name]["check"]
        assert "tests-ran" in lines[name]["check"]["output"]
    assert lines["sabotage"]["check"]["status"] == "error"
    o = run.stats()["outcomes"]
    assert (o["checked"], o["passed"], o["failed"], o["error"], o["pass_rate"]) == (4, 1, 2, 1, 0.25)
    assert "1 passed, 2 not passed, 0 timed out, 1 could not run, 0 without a check; pass rate 25.0%" in done.stdout


def test_a_big_tests_directory_is_copied_streamed(tmp_path, harbor_base, docker_run_name):
    """tests/ goes into the container as a tar made while it is sent: the copy never holds a file whole."""
    source = tmp_path / "tests"
    source.mkdir()
    size = 300 * 1024**2
    with open(source / "blob.bin", "wb") as f:  # sparse: 300 MB of zeros that take no disk here
        f.truncate(size)
    (source / "test.sh").write_text("echo hi\n")
    (source / "test.sh").chmod(0o755)
    code = f"""
import resource, sys
from agentbatch.harbor import container
from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.sandboxes.docker_container import DockerSandbox
box = DockerSandbox(SandboxSpec(image="debian:bookworm-slim", run_name="{docker_run_name}"))
try:
    owner = container.probe(box)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    container.put_dir(box, sys.argv[1], "/tests", owner)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
    print(box.exec("stat -c '%n %s %a' /tests/blob.bin /tests/test.sh", 60).output, end="")
finally:
    box.cleanup()
"""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code, str(source)], capture_output=True, text=True, timeout=600, cwd=root
    )
    assert done.returncode == 0, done.stderr
    grown_kib, *stats = done.stdout.splitlines()
    assert stats == [f"/tests/blob.bin {size} 644", "/tests/test.sh 8 755"]
    assert int(grown_kib) * 1024 < size // 8, f"the copy grew the process by {grown_kib} KiB"
