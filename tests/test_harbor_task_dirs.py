"""Harbor task directories read and checked without Docker: both task.toml schemas, the identity an edit
changes, and every kind of bad input skipped with a one-line reason (docs/harbor.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentbatch.harbor import task_dir
from agentbatch.harbor.task_config import TaskError, parse
from agentbatch.harbor.task_set import TaskSetError, load_tasks

TASKS = Path(__file__).parent / "harbor_tasks"


def copy_task(tmp_path: Path, name: str = "sum-numbers", as_name: str | None = None) -> Path:
    dest = tmp_path / "set" / (as_name or name)
    shutil.copytree(TASKS / name, dest, symlinks=True)
    return dest


def test_the_terminal_bench_schema_is_read_whole():
    cfg, warnings = parse((TASKS / "sum-numbers" / "task.toml").read_text())
    assert warnings == []
    assert (cfg.schema, cfg.difficulty, cfg.category, cfg.tags) == (
        "2.0",
        "easy",
        "data-processing",
        ["bash", "arithmetic"],
    )
    assert (cfg.agent_timeout, cfg.verifier_timeout, cfg.build_timeout) == (300.0, 60.0, 300.0)
    assert (cfg.cpus, cfg.memory_mb, cfg.storage_mb, cfg.allow_internet, cfg.workdir) == (1.0, 512, 1024, False, "/app")
    assert cfg.metadata["expert_time_estimate_min"] == 1  # free-form metadata is kept, not warned about
    assert cfg.name is None


def test_harbors_task_table_schema_is_read_whole():
    cfg, warnings = parse((TASKS / "partial-credit" / "task.toml").read_text())
    assert warnings == []
    assert (cfg.schema, cfg.name, cfg.difficulty, cfg.category) == (
        "1.1",
        "tests/partial-credit",
        "medium",
        "file-operations",
    )
    assert cfg.tags == ["files", "partial"]  # [task] keywords when [metadata] has no tags
    assert cfg.verifier_env == {"EXPECTED": "3"}
    assert (cfg.agent_timeout, cfg.verifier_timeout, cfg.allow_internet, cfg.workdir) == (120.0, 60.0, True, None)


def test_unknown_and_unapplied_fields_are_warned_about_not_fatal():
    text = """
schema_version = "1.0"
flavour = "odd"
[agent]
timeout_sec = 10
run_tests_in_same_shell = false
[environment]
memory = "2G"
storage = "512M"
gpus = 1
network_mode = "no-network"
env = { TOKEN = "${HOST_TOKEN}", MODE = "x" }
"""
    cfg, warnings = parse(text)
    assert (cfg.memory_mb, cfg.storage_mb, cfg.allow_internet, cfg.env) == (2048, 512, False, {"MODE": "x"})
    assert "unknown field 'flavour' ignored" in warnings
    assert "unknown field [agent] run_tests_in_same_shell ignored" in warnings
    assert any(w.startswith("[environment] gpus is not applied") for w in warnings)
    assert any("env TOKEN is not set" in w for w in warnings)


# Harbor 1.4's own fields (harbor.models.task.config at schema_version 1.4), as a real 1.4 task writes them.
SCHEMA_1_4 = """
schema_version = "1.4"
source = "terminal-bench"
artifacts = ["/app/out.log", { source = "/app/report", destination = "report" }]
multi_step_reward_strategy = "mean"

[task]
name = "org/one-four"
version = "2.1.0"
keywords = ["x"]

[agent]
timeout_sec = 60.0
network_mode = "no-network"

[verifier]
timeout_sec = 30.0
environment_mode = "shared"
network_mode = "no-network"

[[verifier.collect]]
command = "cp /app/state.json /logs/artifacts/ || true"
timeout_sec = 20.0

[[verifier.collect]]
command = "pg_dump > /dump.sql"
service = "db"

[environment]
network_mode = "no-network"
"""


def test_every_field_of_harbor_1_4_is_known_and_what_can_be_applied_is():
    cfg, warnings = parse(SCHEMA_1_4)
    assert not [w for w in warnings if w.startswith("unknown field")], warnings
    # The three network_mode values agree: nothing to say about them, and no network.
    assert not [w for w in warnings if "network" in w] and cfg.allow_internet is False
    # The shared verifier is what this runner does; the main service's collect hook runs before the tests.
    assert [(h.command, h.timeout) for h in cfg.collect] == [("cp /app/state.json /logs/artifacts/ || true", 20.0)]
    assert sorted(warnings) == [
        "[[verifier.collect]] service = 'db' is not applied: no Compose services",
        "artifacts is not applied (no files are collected from the container: the line keeps the check's output)",
    ]
    assert (cfg.name, cfg.agent_timeout, cfg.verifier_timeout) == ("org/one-four", 60.0, 30.0)


@pytest.mark.parametrize(
    "extra, warning",
    [
        ("[verifier]\nenvironment_mode = 'separate'\n", "[verifier] environment_mode = 'separate' is not applied"),
        ("[verifier.environment]\ndocker_image = 'x:1'\n", "[verifier] environment is not applied"),
        ("[agent]\nnetwork_mode = 'no-network'\n", "[verifier] network_mode = 'public' is not applied"),
        ("[verifier]\nnetwork_mode = 'no-network'\n", "[verifier] network_mode = 'no-network' is not applied"),
        ("[agent]\nallowed_hosts = ['pypi.org']\n", "[agent] network_mode = 'allowlist' is not applied"),
    ],
)
def test_a_known_field_not_applied_is_named(extra, warning):
    _, warnings = parse(extra)
    assert any(w.startswith(warning) for w in warnings), warnings


def test_the_agents_network_mode_is_the_containers():
    cfg, warnings = parse("[agent]\nnetwork_mode = 'no-network'\n[environment]\nallow_internet = true\n")
    assert cfg.allow_internet is False  # the agent is kept off the network its task keeps it off
    assert warnings == [
        "[verifier] network_mode = 'public' is not applied: the tests run in the agent's container, "
        "with its network ('no-network')"
    ]


def test_a_multi_step_task_is_refused():
    with pytest.raises(TaskError, match=r"a multi-step task \(\[\[steps\]\]\): this runner runs single-step"):
        parse('schema_version = "1.4"\n[[steps]]\nname = "one"\n')


@pytest.mark.parametrize(
    "text, reason",
    [
        ("[agent\n", "task.toml is not valid TOML"),
        ('[agent]\ntimeout_sec = "long"\n', "[agent] timeout_sec must be a positive number up to 604800, not 'long'"),
        ("[environment]\nworkdir = 'app'\n", "[environment] workdir 'app' is not an absolute path"),
        ("[environment]\nmemory = 'lots'\n", "[environment] memory 'lots' is not a size"),
        ("[environment]\nos = 'windows'\n", "only Linux tasks can run here"),
        ("metadata = 3\n", "[metadata] must be a table"),
        # Numbers the loader took and a sample then broke on: bounded here, each a refusal of the task.
        (
            "[verifier]\ntimeout_sec = 1e10\n",
            "[verifier] timeout_sec must be a positive number up to 604800, not 10000000000.0",
        ),
        ("[environment]\nbuild_timeout_sec = 1e10\n", "[environment] build_timeout_sec must be a positive number"),
        ("[agent]\ntimeout_sec = inf\n", "[agent] timeout_sec must be a positive number up to 604800, not inf"),
        ("[agent]\ntimeout_sec = nan\n", "[agent] timeout_sec must be a positive number up to 604800, not nan"),
        (f"[agent]\ntimeout_sec = {'9' * 400}\n", "[agent] timeout_sec must be a positive number up to 604800"),
        ("[environment]\nmemory_mb = 1e300\n", "[environment] memory_mb must be a positive number up to 16777216"),
        ("[environment]\ncpus = 1e300\n", "[environment] cpus must be a positive number up to 1000000,"),
        (f"[environment]\nmemory = '{'9' * 400}G'\n", "[environment] memory '99999999999999999999999999999999"),
        ("[environment]\nstorage = '99999999999G'\n", "[environment] storage '99999999999G' is not a size from 1K"),
        (
            "[[verifier.collect]]\ncommand = 'x'\ntimeout_sec = 1e10\n",
            "[[verifier.collect]] timeout_sec must be a positive",
        ),
        ("[verifier]\nenvironment_mode = 'elsewhere'\n", "environment_mode 'elsewhere' is not one of shared"),
        ("[environment]\nnetwork_mode = 'dialup'\n", "network_mode 'dialup' is not one of public"),
    ],
)
def test_an_unusable_task_toml_is_one_line_reason(text, reason):
    with pytest.raises(TaskError) as e:
        parse(text)
    assert reason in str(e.value) and "\n" not in str(e.value)


def test_a_task_set_skips_each_bad_task_with_its_reason_and_keeps_the_others(tmp_path):
    copy_task(tmp_path, "sum-numbers")
    os.remove(copy_task(tmp_path, "sum-numbers", "no-instruction") / "instruction.md")
    os.remove(copy_task(tmp_path, "sum-numbers", "no-toml") / "task.toml")
    (copy_task(tmp_path, "sum-numbers", "bad-toml") / "task.toml").write_text("version = \n")
    os.remove(copy_task(tmp_path, "sum-numbers", "no-test") / "tests" / "test.sh")
    os.symlink("/etc/passwd", copy_task(tmp_path, "sum-numbers", "escapes") / "environment" / "passwd")
    shutil.rmtree(copy_task(tmp_path, "sum-numbers", "no-env") / "environment")
    big = copy_task(tmp_path, "sum-numbers", "too-big") / "environment" / "blob.bin"
    with open(big, "wb") as f:  # sparse: over the limit without filling the disk
        f.truncate(task_dir.MAX_CONTEXT_BYTES + 1)
    (tmp_path / "set" / "notes").mkdir()  # a directory that is not a task at all
    (tmp_path / "set" / ".git").mkdir()  # hidden: not looked at
    (tmp_path / "set" / "README.md").write_text("not a task")

    tasks, warnings = load_tasks(str(tmp_path / "set"))

    assert [t.name for t in tasks] == ["sum-numbers"]
    reasons = {w.split(": skipped: ")[0].rsplit("/", 1)[-1]: w.split(": skipped: ")[1] for w in warnings}
    assert reasons == {
        "bad-toml": reasons["bad-toml"],
        "escapes": "environment/passwd is a symlink to /etc/passwd, outside the task directory",
        "no-env": "no environment/Dockerfile, environment/docker-compose.yaml or [environment] docker_image",
        "no-instruction": "not a task directory: no instruction.md",
        "no-test": "no tests/test.sh: the task has no verifier",
        "no-toml": "not a task directory: no task.toml",
        "notes": "not a task directory: no instruction.md",
        "too-big": reasons["too-big"],
    }
    assert reasons["bad-toml"].startswith("task.toml is not valid TOML")
    assert reasons["too-big"].endswith("bytes, over the limit of 1073741824 (1 GiB)")
    assert all("\n" not in w for w in warnings)


def test_one_task_directory_is_a_task_set_of_one():
    tasks, warnings = load_tasks(str(TASKS / "partial-credit"))
    assert [t.name for t in tasks] == ["tests/partial-credit"] and warnings == []
    task = tasks[0]
    assert task.metadata == {
        "name": "tests/partial-credit",
        "difficulty": "medium",
        "category": "file-operations",
        "tags": ["files", "partial"],
        "image": task.image,
        "image_id": None,  # known once the run has built or found it
    }
    assert task.image.startswith("br-harbor/tests-partial-credit:") and task.builds


def test_an_empty_directory_is_no_task_set(tmp_path):
    with pytest.raises(TaskSetError, match="is a directory but holds no Harbor task"):
        load_tasks(str(tmp_path))


def test_the_identity_follows_every_file_and_the_image_only_the_build_context(tmp_path):
    path = copy_task(tmp_path)
    before = task_dir.load(str(path))
    assert task_dir.load(str(path)).identity == before.identity  # stable
    (path / "tests" / "test.sh").write_text((path / "tests" / "test.sh").read_text() + "\n# edited\n")
    edited_test = task_dir.load(str(path))
    assert edited_test.identity != before.identity and edited_test.image == before.image
    (path / "environment" / "numbers.txt").write_text("1\n")
    edited_env = task_dir.load(str(path))
    assert edited_env.image != before.image
    os.chmod(path / "environment" / "numbers.txt", 0o755)  # COPY keeps the mode: another image
    assert task_dir.load(str(path)).image != edited_env.image


def test_a_symlink_inside_the_task_is_allowed_and_canary_lines_are_not_shown(tmp_path):
    path = copy_task(tmp_path)
    os.symlink("../tests/test.sh", path / "environment" / "test-link")
    (path / "instruction.md").write_text("<!-- BENCHMARK DATA canary GUID 1234 -->\n\nDo the thing.\n")
    task = task_dir.load(str(path))
    assert task.instruction == "Do the thing.\n"


def test_a_prebuilt_image_is_used_as_is(tmp_path):
    path = copy_task(tmp_path)
    shutil.rmtree(path / "environment")
    toml = (
        (path / "task.toml")
        .read_text()
        .replace("[environment]\n", '[environment]\ndocker_image = "br-test-busybox:1"\n')
    )
    (path / "task.toml").write_text(toml)
    task = task_dir.load(str(path))
    assert (task.image, task.builds, task.context_hash) == ("br-test-busybox:1", False, None)


def load_in_a_small_process(task_set: Path) -> subprocess.CompletedProcess:
    """load_tasks in a process of at most 1 GiB of memory, printing its warnings: a file read whole would not fit."""
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
        "from agentbatch.harbor.task_set import load_tasks; "
        "tasks, warnings = load_tasks(sys.argv[1]); print([t.name for t in tasks]); print(*warnings, sep='\\n')"
    )
    root = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, "-c", code, str(task_set)], capture_output=True, text=True, timeout=120, cwd=root
    )


def test_big_files_are_refused_before_anything_is_read(tmp_path):
    huge = tmp_path / "huge.md"
    with open(huge, "wb") as f:  # sparse: 5 GB that take no disk
        f.truncate(5 * 1024**3)
    (copy_task(tmp_path, "sum-numbers", "big-instruction") / "instruction.md").unlink()
    os.link(huge, tmp_path / "set" / "big-instruction" / "instruction.md")
    linked = copy_task(tmp_path, "sum-numbers", "linked-instruction") / "instruction.md"
    linked.unlink()
    os.symlink(huge, linked)
    big_tests = copy_task(tmp_path, "sum-numbers", "big-tests") / "tests" / "data.bin"
    with open(big_tests, "wb") as f:
        f.truncate(task_dir.MAX_CONTEXT_BYTES + 1)
    tests_bytes = task_dir.MAX_CONTEXT_BYTES + 1 + (TASKS / "sum-numbers" / "tests" / "test.sh").stat().st_size
    copy_task(tmp_path, "sum-numbers", "fine")

    done = load_in_a_small_process(tmp_path / "set")

    assert done.returncode == 0, done.stderr
    names, *warnings = done.stdout.splitlines()
    assert names == "['fine']"
    reasons = dict(w.split(": skipped: ") for w in warnings)
    assert {k.rsplit("/", 1)[-1]: v for k, v in reasons.items()} == {
        "big-instruction": f"instruction.md is {5 * 1024**3} bytes, over the limit of 4000000",
        "linked-instruction": f"instruction.md is a symlink to {huge}, outside the task directory",
        "big-tests": f"tests/ holds {tests_bytes} bytes, over the limit of 1073741824 (1 GiB)",
    }
