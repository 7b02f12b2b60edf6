"""The Docker backend against the real engine, driven through the registry's tools."""

from __future__ import annotations

import json
import threading
import time

import conftest_docker
import docker
import pytest
from conftest_docker import leftover_containers
from helpers import make_ctx

from agentbatch.sandboxes import docker_container, registry
from agentbatch.sandboxes.base import RUN_DIR_LABEL, SandboxError, SandboxSettings, SandboxSpec, owner_labels
from agentbatch.sandboxes.output import KILL_GRACE, MAX_KEPT_OUTPUT
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings

pytestmark = pytest.mark.docker
DOCKER = SandboxSettings(kind="docker")
MISSING_IMAGE = "br-test-missing/never-built:1"
# Registered here as well so this file runs on its own; tests/conftest.py re-exports them for other files.
docker_images = conftest_docker.docker_images
docker_run_name = conftest_docker.docker_run_name


@pytest.fixture(autouse=True)
def _no_leftover_containers(docker_run_name):
    """Every test here ends with no container of its run left (docker_run_name asserts it)."""
    yield


@pytest.fixture
def contexts(docker_run_name):
    """Make ToolContexts for docker sandboxes of this test's run, closing each when the test ends."""
    made: list[ToolContext] = []

    def make(image: str | None, cwd: str | None = None, timeout: float = 30.0, labels=None, **limits) -> ToolContext:
        settings = SandboxSettings(kind="docker", **limits)
        spec = SandboxSpec(settings, image=image, cwd=cwd, run_name=docker_run_name, labels=labels or {})
        ctx = make_ctx(ToolSettings(command_timeout=timeout), spec)
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


def tool(ctx: ToolContext, name: str, **args) -> tuple[dict, bool]:
    """Call a registered tool as the agent loop does: JSON arguments in, JSON result out."""
    raw, ok = call_tool(load_tools()[name], json.dumps(args), ctx)
    return json.loads(raw), ok


def sh(ctx: ToolContext, command: str, **args) -> str:
    """Run a terminal command that must succeed; its output."""
    result, ok = tool(ctx, "terminal", command=command, **args)
    assert ok and result["exit_code"] == 0, result
    return result["output"]


def container_of(ctx: ToolContext):
    return docker.from_env().containers.get(ctx.sandbox().container_id)


def test_each_prompt_sees_its_own_image_and_cwd(contexts, docker_images):
    one, two = docker_images
    first = contexts(one, cwd="/work/first/deep")  # absent from the image: created
    second = contexts(two)  # no cwd: the image's WORKDIR
    third = contexts(one)  # neither: the documented default

    assert sh(first, "cat /etc/br-image; pwd").split() == [one, "/work/first/deep"]
    assert sh(second, "cat /etc/br-image; pwd; cat /opt/only-in-2").splitlines() == [
        two,
        "/srv/two",
        "only in image 2",
    ]
    assert sh(third, "pwd").strip() == docker_container.DEFAULT_WORKDIR
    result, ok = tool(first, "terminal", command="cat /opt/only-in-2")
    assert ok and result["exit_code"] != 0  # a failing command is a result, not a tool failure
    result, ok = tool(first, "terminal", command="echo 123; if then fi")
    assert ok and result["exit_code"] == 2 and "syntax error" in result["output"], result
    # Files written in one prompt's sandbox never show up in another's.
    sh(first, "echo mine > /tmp/owner")
    assert "mine" not in sh(third, "cat /tmp/owner 2>&1 || true")
    assert len({c.sandbox().container_id for c in (first, second, third)}) == 3


def test_file_tools_and_terminal_see_the_same_files(contexts, docker_images):
    ctx = contexts(docker_images[0], cwd="/project")

    written, ok = tool(ctx, "write_file", path="notes/todo.txt", content="buy milk\nünïcode ✓\n")
    assert ok, written
    assert sh(ctx, "cat /project/notes/todo.txt") == "buy milk\nünïcode ✓\n"

    sh(ctx, "mkdir -p src && printf 'alpha = 1\\nbeta = 2\\n' > src/conf.py && chmod 755 src")
    read, ok = tool(ctx, "read_file", path="src/conf.py")
    assert ok and read["content"] == "alpha = 1\nbeta = 2\n" and read["total_lines"] == 2
    read, ok = tool(ctx, "read_file", path="/project/src/conf.py", offset=2, limit=1)
    assert ok and read["content"] == "beta = 2\n"

    found, ok = tool(ctx, "search_files", pattern="be+ta", path="src")
    assert ok and found["matches"] == ["src/conf.py:2:beta = 2"]

    patched, ok = tool(ctx, "patch", path="src/conf.py", old_string="beta = 2", new_string="beta = 3")
    assert ok, patched
    assert sh(ctx, "cat src/conf.py") == "alpha = 1\nbeta = 3\n"

    missing, ok = tool(ctx, "read_file", path="nope.txt")
    assert not ok and "/project/nope.txt" in missing["error"]
    directory, ok = tool(ctx, "read_file", path="src")
    assert not ok and "directory" in directory["error"]


def test_write_file_makes_parents_without_replacing_symlinked_directories(contexts, docker_images):
    ctx = contexts(docker_images[0])
    sh(ctx, "mkdir /real && ln -s /real /linked && ln -s /real/target.txt /workspace/alias")

    assert tool(ctx, "write_file", path="/linked/new/dir/f.txt", content="through the link")[1]
    assert (
        sh(ctx, "cat /real/new/dir/f.txt; [ -L /linked ] && echo still-a-link") == "through the link" + "still-a-link\n"
    )
    assert tool(ctx, "write_file", path="/brand/new/top.txt", content="x")[1]
    assert sh(ctx, "cat /brand/new/top.txt") == "x"
    # Docker's archive extraction would replace a directory by the file; it must refuse instead.
    over_dir, ok = tool(ctx, "write_file", path="/brand", content="clobber")
    assert not ok and "/brand" in over_dir["error"]
    assert sh(ctx, "cat /brand/new/top.txt") == "x"

    sh(ctx, "echo via-symlink > /real/target.txt")
    read, ok = tool(ctx, "read_file", path="alias")
    assert ok and read["content"] == "via-symlink\n"


def test_a_non_root_image_user_owns_its_workdir_and_written_files(contexts, docker_images):
    ctx = contexts(conftest_docker.IMAGE_NOBODY)
    assert sh(ctx, "id -u; pwd").split() == ["65534", docker_container.DEFAULT_WORKDIR]
    assert tool(ctx, "write_file", path="sub/made.txt", content="from the tool\n")[1]
    # The user can extend the tool's file and create its own next to it, in the directory Docker made as root.
    assert sh(ctx, "echo by-user >> sub/made.txt && echo own > own.txt && cat sub/made.txt own.txt") == (
        "from the tool\nby-user\nown\n"
    )
    env = sh(ctx, "env")
    assert "HOME=/root" not in env


def test_unavailable_image_fails_at_once_with_a_clear_message(contexts, docker_run_name):
    spec = SandboxSpec(DOCKER, image=MISSING_IMAGE, run_name=docker_run_name)
    start = time.monotonic()
    with pytest.raises(SandboxError) as raised:
        registry.get("docker").prepare(spec)
    assert time.monotonic() - start < 15
    message = str(raised.value)
    assert MISSING_IMAGE in message and "\n" not in message

    # Reached through a tool (a row whose image vanished after the check), it is an error the model sees.
    result, ok = tool(contexts(MISSING_IMAGE), "terminal", command="echo hi")
    assert not ok and MISSING_IMAGE in result["error"]
    assert leftover_containers(docker_run_name) == []

    with pytest.raises(SandboxError, match="absolute"):
        registry.get("docker").prepare(SandboxSpec(DOCKER, image=docker_run_name, cwd="relative/dir"))
    with pytest.raises(SandboxError, match="no Docker image"):
        registry.get("docker").prepare(SandboxSpec(DOCKER, image=None))


def test_a_command_past_its_timeout_is_killed_with_what_it_started(contexts, docker_images):
    ctx = contexts(docker_images[0], timeout=2)
    sh(ctx, "true")  # the container exists before the clock starts
    start = time.monotonic()
    result, ok = tool(ctx, "terminal", command="echo started; sleep 41 & sleep 42; echo never")
    elapsed = time.monotonic() - start

    assert not ok and "timed out" in result["error"]
    assert "started" in result["output"] and "never" not in result["output"]
    assert 2 <= elapsed < 2 + KILL_GRACE
    assert "sleep 4" not in sh(ctx, "ps -o args")  # the background child went too, not just the shell
    assert sh(ctx, "echo still usable") == "still usable\n"


def test_a_process_that_leaves_the_session_is_killed_at_the_timeout_too(contexts, docker_images):
    ctx = contexts(docker_images[0], timeout=1)
    sh(ctx, "true")
    start = time.monotonic()
    # setsid leaves the killed session and keeps the output pipe open: it goes too, and the call ends.
    result, ok = tool(ctx, "terminal", command="setsid sleep 43 & echo detached; sleep 44")
    assert not ok and "timed out" in result["error"] and "detached" in result["output"]
    assert time.monotonic() - start < 1 + KILL_GRACE + 2
    assert "sleep 4" not in sh(ctx, "ps -o args"), "a setsid process outlived its command's timeout"
    assert sh(ctx, "echo next") == "next\n"


def test_a_timeout_kills_every_escape_and_nothing_of_earlier_commands(contexts, docker_images):
    """nohup, setsid, a double fork, a cleared environment: all go; a server an earlier command left stays."""
    ctx = contexts(docker_images[0], timeout=2)
    sh(ctx, "setsid sleep 1042 > /dev/null 2>&1 & echo left")  # a server of its own: it stays
    escapes = [
        "nohup sleep 2041 > /dev/null 2>&1 &",
        "setsid sleep 2042 > /dev/null 2>&1 &",
        "( setsid sh -c 'sleep 2043 & exit 0' & ) > /dev/null 2>&1",
        "env -i sleep 2044 > /dev/null 2>&1 &",
        "( setsid env -i sh -c 'sleep 2045 & exit 0' & ) > /dev/null 2>&1",
        "( while :; do sleep 2046 & sleep 0.05; done ) > /dev/null 2>&1 &",
        "echo started; sleep 2047",
    ]
    result, ok = tool(ctx, "terminal", command="\n".join(escapes))
    assert not ok and "timed out" in result["error"] and "started" in result["output"]
    time.sleep(0.5)  # a respawner killed too late would have started another sleep by now
    left = sh(ctx, "ps -o args")
    assert [n for n in range(2041, 2048) if f"sleep {n}" in left] == [], left
    assert "sleep 1042" in left, "the timeout killed what an earlier command left"


def test_host_environment_never_reaches_the_container(contexts, docker_images, monkeypatch):
    monkeypatch.setenv("BR_HOST_MARKER", "host-secret-4711")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-should-never-leak")
    ctx = contexts(docker_images[0])

    env = dict(line.split("=", 1) for line in sh(ctx, "env").splitlines() if "=" in line)
    assert "BR_HOST_MARKER" not in env and "OPENROUTER_API_KEY" not in env
    assert not any("host-secret-4711" in v or "sk-or-" in v for v in env.values())
    assert env["HOME"] == "/root" and env["PATH"] == "/bin"  # the image's own PATH wins over the default


def test_resource_limits_labels_and_network_are_applied(contexts, docker_images, docker_run_name):
    limited = contexts(
        docker_images[0], memory="64m", cpus=0.5, pids=24, network=False, labels={"team": "data", "shard": "3"}
    )
    sh(limited, "true")
    attrs = container_of(limited).attrs
    host = attrs["HostConfig"]
    assert host["Memory"] == 64 * 1024 * 1024 and host["MemorySwap"] == 64 * 1024 * 1024
    assert host["PidsLimit"] == 24 and host["NanoCpus"] == 500_000_000
    assert host["NetworkMode"] == "none"
    assert attrs["Config"]["Labels"] == {"batch_runner.run": docker_run_name, "team": "data", "shard": "3"}
    assert sh(limited, "ls /sys/class/net").split() == ["lo"]

    # The pids limit is enforced, not just recorded: forking past it fails inside the container.
    forked, _ = tool(limited, "terminal", command="for i in $(seq 40); do sleep 5 & done; wait", timeout=20)
    assert "fork" in forked["output"].lower(), forked

    networked = contexts(docker_images[0])
    assert "eth0" in sh(networked, "ls /sys/class/net").split()
    assert container_of(networked).attrs["HostConfig"]["NetworkMode"] == "bridge"


def test_many_sandboxes_in_parallel_threads_do_not_interfere(contexts, docker_images):
    count = 8
    ctxs = [contexts(docker_images[i % 2], cwd=f"/job/{i}") for i in range(count)]
    errors: list[str] = []
    barrier = threading.Barrier(count)

    def work(i: int, ctx: ToolContext) -> None:
        try:
            barrier.wait(timeout=60)
            assert tool(ctx, "write_file", path="id.txt", content=f"prompt {i}\n")[1]
            out = sh(ctx, "cat id.txt; pwd; cat /etc/br-image; ls /job")
            assert out.splitlines() == [f"prompt {i}", f"/job/{i}", docker_images[i % 2], str(i)], out
            sh(ctx, f"echo more-{i} >> id.txt")
            assert tool(ctx, "read_file", path="id.txt")[0]["content"] == f"prompt {i}\nmore-{i}\n"
        except Exception as e:  # collected and re-raised below, so one thread's failure names itself
            errors.append(f"prompt {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(i, ctx)) for i, ctx in enumerate(ctxs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors
    assert len({c.sandbox().container_id for c in ctxs}) == count
    closers = [threading.Thread(target=c.close) for c in ctxs]
    for t in closers:
        t.start()
    for t in closers:
        t.join(timeout=60)


def test_reap_removes_only_the_containers_of_that_run_directory(docker_images, docker_run_name, tmp_path):
    """Same --run_name, another --output_dir: another run directory, whose containers a reap never touches."""
    mine, other = owner_labels(str(tmp_path / "a" / "run"), "dead"), owner_labels(str(tmp_path / "b" / "run"), "live")

    def sandbox(image: str, labels: dict) -> docker_container.DockerSandbox:
        return docker_container.DockerSandbox(SandboxSpec(DOCKER, image=image, run_name=docker_run_name, labels=labels))

    left = [sandbox(docker_images[0], mine), sandbox(docker_images[1], mine)]
    survivor = sandbox(docker_images[0], other)
    try:
        assert len(leftover_containers(docker_run_name)) == 3
        assert registry.get("docker").reap({RUN_DIR_LABEL: mine[RUN_DIR_LABEL]}) == 2
        assert len(leftover_containers(docker_run_name)) == 1
        assert survivor.exec("echo alive", 10).output == "alive\n"
        for s in left:  # cleanup of a container someone else removed is quiet
            s.cleanup()
        assert registry.get("docker").reap({RUN_DIR_LABEL: mine[RUN_DIR_LABEL]}) == 0
    finally:
        survivor.cleanup()
    assert leftover_containers(docker_run_name) == []


def test_cleanup_is_idempotent_and_a_cleaned_sandbox_refuses_work(docker_images, docker_run_name):
    sandbox = docker_container.DockerSandbox(SandboxSpec(DOCKER, image=docker_images[0], run_name=docker_run_name))
    assert sandbox.exec("exit 7", 10).exit_code == 7
    sandbox.cleanup()
    sandbox.cleanup()
    with pytest.raises(SandboxError):
        sandbox.exec("true", 10)


def test_huge_output_keeps_head_and_tail(docker_images, docker_run_name):
    sandbox = docker_container.DockerSandbox(SandboxSpec(DOCKER, image=docker_images[0], run_name=docker_run_name))
    try:
        cap = MAX_KEPT_OUTPUT
        result = sandbox.exec(f"echo FIRST; yes filler | head -c {5 * cap}; echo; echo LAST", 60)
        assert result.exit_code == 0
        assert result.output.startswith("FIRST\n") and result.output.endswith("LAST\n")
        assert "bytes cut" in result.output and len(result.output) < 3 * cap
    finally:
        sandbox.cleanup()
