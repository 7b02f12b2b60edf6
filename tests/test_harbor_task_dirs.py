"""Harbor task directories read and checked without Docker: both task.toml schemas, the identity an edit
changes, and every kind of bad input skipped with a one-line reason (docs/harbor.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentbatch.harbor import network_policy, task_dir
from agentbatch.harbor.task_config import Artifact, Policy, TaskError, parse
from agentbatch.harbor.task_set import TaskSetError, load_tasks
from agentbatch.sandboxes.base import Egress

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
    assert (cfg.cpus, cfg.memory_mb, cfg.storage_mb, cfg.workdir) == (1.0, 512, 1024, "/app")
    assert cfg.environment.network == Policy("no-network")  # allow_internet = false, the older way
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
    assert (cfg.agent_timeout, cfg.verifier_timeout, cfg.environment.network, cfg.workdir) == (
        120.0,
        60.0,
        Policy("public"),
        None,
    )


def test_unknown_fields_are_warned_about_not_fatal():
    text = """
schema_version = "1.0"
flavour = "odd"
[agent]
timeout_sec = 10
run_tests_in_same_shell = false
setup_timeout_sec = 30
[environment]
memory = "2G"
storage = "512M"
gpus = 0
network_mode = "no-network"
env = { TOKEN = "${BR_TEST_UNSET_TOKEN:-fallback}", MODE = "x", TEXT = "a${X}b" }
skills_dir = "/skills"
[verifier.environment]
docker_image = "x:1"
flavour = "odd"
"""
    cfg, warnings = parse(text)
    # As Harbor's resolve_env_vars: a template's default where this machine does not set the variable; a value that is
    # not one template, a literal.
    assert (cfg.memory_mb, cfg.storage_mb, cfg.env) == (2048, 512, {"TOKEN": "fallback", "MODE": "x", "TEXT": "a${X}b"})
    assert cfg.environment.network == Policy("no-network")
    assert "unknown field 'flavour' ignored" in warnings
    assert "unknown field [agent] run_tests_in_same_shell ignored" in warnings
    # Never a task.toml field: Harbor's agent setup limit is a constant of its own (trial.py).
    assert "unknown field [agent] setup_timeout_sec ignored" in warnings
    assert "unknown field [verifier.environment] flavour ignored" in warnings
    assert not any("skills_dir" in w for w in warnings)  # applied: listed in the agent's prompt (test_harbor_skills)


# Harbor 1.4's own fields (harbor.models.task.config at schema_version 1.4), as a real 1.4 task writes them.
SCHEMA_1_4 = """
schema_version = "1.4"
source = "terminal-bench"
artifacts = ["/app/out.log", { source = "/app/report", destination = "report", exclude = ["*.tmp"] }]
multi_step_reward_strategy = "mean"

[task]
name = "org/one-four"
version = "2.1.0"
keywords = ["x"]

[agent]
timeout_sec = 60.0
user = "agent"
network_mode = "allowlist"
allowed_hosts = ["PyPI.org.", "10.0.0.0/8", "2001:DB8::1"]

[verifier]
timeout_sec = 30.0
user = 0
environment_mode = "separate"
network_mode = "no-network"

[verifier.environment]
docker_image = "verifier:1"
cpus = 2
allow_internet = false

[[verifier.collect]]
command = "cp /app/state.json /logs/artifacts/ || true"
timeout_sec = 20.0

[[verifier.collect]]
command = "pg_dump > /dump.sql"
service = "db"
user = "postgres"

[environment]
network_mode = "public"
healthcheck = { command = "test -f /ready", interval_sec = 1, retries = 5, start_period_sec = 0 }
mcp_servers = [
  { name = "search", url = "http://search:8000/sse" },
  { name = "files", transport = "stdio", command = "mcp-files", args = ["/app"] },
  { name = "api", transport = "http", url = "http://localhost:9000/mcp" },
]

[solution]
env = { MODE = "reference" }
"""


def test_every_field_of_harbor_1_4_is_known_and_applied():
    cfg, warnings = parse(SCHEMA_1_4)
    assert warnings == []
    assert (cfg.name, cfg.agent_timeout, cfg.verifier_timeout) == ("org/one-four", 60.0, 30.0)
    assert (cfg.agent_user, cfg.verifier_user) == ("agent", "0")
    # The network plan, as Harbor resolves it: hosts normalized; the separate verifier's own baseline.
    assert cfg.policies() == (
        Policy("public"),
        Policy("allowlist", ("pypi.org", "10.0.0.0/8", "2001:db8::1")),
        Policy("no-network"),
        Policy("no-network"),
    )
    assert cfg.separate and cfg.verifier_config.docker_image == "verifier:1" and cfg.verifier_config.cpus == 2
    assert [(h.command, h.service, h.user) for h in cfg.collect] == [
        ("cp /app/state.json /logs/artifacts/ || true", "main", None),
        ("pg_dump > /dump.sql", "db", "postgres"),
    ]
    assert cfg.artifacts == [Artifact("/app/out.log"), Artifact("/app/report", "report", ("*.tmp",))]
    assert cfg.services() == {"db"}
    hc = cfg.environment.healthcheck
    assert (hc.command, hc.interval, hc.timeout, hc.retries) == ("test -f /ready", 1.0, 30.0, 5)
    assert [(s.name, s.transport, s.url, s.command) for s in cfg.environment.mcp_servers] == [
        ("search", "sse", "http://search:8000/sse", None),  # sse is Harbor's default transport
        ("files", "stdio", None, "mcp-files"),
        ("api", "streamable-http", "http://localhost:9000/mcp", None),  # "http" is its alias
    ]
    assert cfg.solution_env == {"MODE": "reference"}


def test_the_verifier_mode_is_harbors():
    assert not parse("")[0].separate  # shared by default
    assert parse("[verifier.environment]\ndocker_image = 'v:1'\n")[0].separate  # an environment implies separate
    separate = parse("[verifier]\nenvironment_mode = 'separate'\n[environment]\nnetwork_mode = 'no-network'\n")[0]
    # Without [verifier.environment], a copy of [environment]: its network baseline too.
    assert separate.separate and separate.policies()[2] == Policy("no-network")


def test_an_agent_phase_policy_controls_the_container_and_a_shared_verifier_phase_too():
    cfg, _ = parse("[agent]\nnetwork_mode = 'no-network'\n[environment]\nallow_internet = true\n")
    assert cfg.policies() == (Policy("public"), Policy("no-network"), Policy("public"), Policy("public"))
    assert network_policy.agent_container(cfg, compose=False) == (True, Egress(None))  # open at start
    everywhere, _ = parse("[environment]\nnetwork_mode = 'no-network'\n")
    assert network_policy.agent_container(everywhere, compose=False) == (False, None)  # a loopback only
    assert network_policy.agent_container(everywhere, compose=True) == (True, Egress(()))  # its services only


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
        ("[verifier]\nenvironment_mode = 'shared'\n[verifier.environment]\n", "conflicts with [verifier.environment]"),
        ("[environment]\nnetwork_mode = 'dialup'\n", "network_mode 'dialup' is not one of public"),
        # What Harbor's docker environment refuses, and what Harbor's validation rejects.
        ("[environment]\ngpus = 1\n", "[environment] gpus = 1: containers here get no GPUs"),
        ("[environment]\ntpu = { type = 'v6e', topology = '2x4' }\n", "[environment] tpu: containers here get no TPUs"),
        (
            "[agent]\nallowed_hosts = ['pypi.org']\n",
            "[agent] allowed_hosts is only valid with network_mode = 'allowlist'",
        ),
        ("[environment]\nallowed_hosts = ['a.b']\n", "[environment] allowed_hosts is only valid with network_mode"),
        (
            "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['https://pypi.org/simple']\n",
            "entries must be host names, IP addresses or CIDR ranges, not URLs",
        ),
        (
            "[environment]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['10.0.0.1/8']\n",
            "entries must be host names, IP addresses or CIDR ranges",
        ),
        # The egress rules match addresses: a wildcard would have to be let through or refused.
        ("[agent]\nnetwork_mode = 'allowlist'\nallowed_hosts = ['*.pypi.org']\n", "a wildcard cannot be enforced"),
        ("[agent]\nuser = 'a b'\n", "[agent] user 'a b' is not a user name"),
        ("[verifier]\nuser = true\n", "[verifier] user must be a user name or uid"),
        ("artifacts = ['/app/../etc/passwd']\n", "artifacts source '/app/../etc/passwd' must not contain '..'"),
        ("artifacts = [{ source = '/a', destination = '/abs' }]\n", "must be a relative path"),
        ("artifacts = [{ source = '/a', destination = 'manifest.json' }]\n", "'manifest.json' is reserved"),
        ("artifacts = [{ source = 'rel', service = 'db' }]\n", "collected from service 'db' must be absolute"),
        ("[environment]\nmcp_servers = [{ name = 'x' }]\n", "an http(s) url is required for transport 'sse'"),
        ("[environment]\nmcp_servers = [{ name = 'x', transport = 'stdio' }]\n", "a command is required"),
        ("[environment]\nmcp_servers = [{ name = 'a b', url = 'http://h/' }]\n", "mcp_servers name 'a b'"),
        ("[environment]\nhealthcheck = { interval_sec = 1 }\n", "[environment] healthcheck needs a command"),
        # A value of this machine's environment never enters a container (Harbor's would be passed in).
        (
            "[verifier]\nenv = { K = '${BR_TEST_SET_VAR}' }\n",
            "[verifier] env K takes ${BR_TEST_SET_VAR} from the host, which is set on this machine",
        ),
        (
            "[environment]\nenv = { K = '${BR_TEST_SET_VAR:-d}' }\n",
            "[environment] env K takes ${BR_TEST_SET_VAR} from the host, which is set",
        ),
        (
            "[solution]\nenv = { K = '${BR_TEST_UNSET_VAR}' }\n",
            "[solution] env K takes ${BR_TEST_UNSET_VAR} from the host, which has no default",
        ),
    ],
)
def test_an_unusable_task_toml_is_one_line_reason(text, reason, monkeypatch):
    monkeypatch.setenv("BR_TEST_SET_VAR", "a value of the machine's")
    monkeypatch.delenv("BR_TEST_UNSET_VAR", raising=False)
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
