"""A sample container's resident shell (sandboxes/docker_resident.py), against the real engine.

The sample's commands run in one `docker exec` (busybox-only and Debian images alike), and each gets what
its own exec gave it: environment, line numbers, exit code, output until every holder closed it, a timeout
that kills what it started and leaves the shell serving. A command that kills the shell fails alone with a
clear error and the next gets a new shell; an image that cannot make the FIFO, two commands at once and the
runner's own kill-everything command (exec_alone) run in execs of their own.
"""

from __future__ import annotations

import threading
import time

import conftest_docker
import pytest
from sandbox_support import freed_without_the_collector

from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import Resources, SandboxError, SandboxSettings, SandboxSpec

pytestmark = pytest.mark.docker
docker_images = conftest_docker.docker_images
docker_run_name = conftest_docker.docker_run_name
DEBIAN = "debian:bookworm-slim"  # tests/build_debian_image.sh: bash, coreutils, util-linux


@pytest.fixture
def made(docker_run_name):
    boxes = []

    def make(image: str, **resources):
        spec = SandboxSpec(
            SandboxSettings(kind="docker"),
            image=image,
            run_name=docker_run_name,
            resources=Resources(**resources) if resources else None,
        )
        boxes.append(registry.get("docker").create(spec))
        return boxes[-1]

    yield make
    for box in boxes:
        box.cleanup()


@pytest.fixture(params=["busybox", "debian"])
def box(request, made, docker_images):
    if request.param == "debian":
        import docker

        try:
            docker.from_env().images.get(DEBIAN)
        except docker.errors.ImageNotFound:
            pytest.fail(f"{DEBIAN} is not built: sh tests/build_debian_image.sh")
    return made(docker_images[0] if request.param == "busybox" else DEBIAN)


def parent_of_command(box) -> str:
    return box.exec("echo $PPID", 30).output.strip()


PS = "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done"  # Debian's slim image has no ps
PROBE = 'echo "$0 $-"; env | grep -v -e ^BR_EXEC_ID= -e ^_= | sort; ulimit -a; grep SigIgn /proc/self/status; pwd; id'


def test_commands_run_in_one_shell_and_get_what_their_own_exec_gave(box):
    resident = box.exec(PROBE, 30)
    apart = box._exec_apart(PROBE, 30)
    assert resident.exit_code == apart.exit_code == 0 and resident.output == apart.output
    shell = parent_of_command(box)
    assert shell != "0" and parent_of_command(box) == shell  # a child of the same shell, not of the engine
    assert box._exec_apart("echo $PPID", 30).output.strip() == "0"
    for command in ("true\nno-such-command-here", "exit 7", "printf 'no newline'", "echo 'it'\"'\"'s'\n\n"):
        resident, apart = box.exec(command, 30), box._exec_apart(command, 30)
        assert (resident.output, resident.exit_code) == (apart.output, apart.exit_code), command
    with pytest.raises(ValueError, match="embedded null byte"):
        box.exec("echo a\0b", 30)


def test_output_lasts_until_every_holder_closed_it_as_an_exec(box):
    start = time.monotonic()
    result = box.exec("(sleep 1; echo late) & echo early", 30)
    assert result.output == "early\nlate\n" and time.monotonic() - start >= 1.0


def test_a_timeout_kills_what_the_command_started_and_the_shell_serves_on(box):
    box.exec("setsid sleep 1042 > /dev/null 2>&1 & echo left", 30)  # a server of an earlier command: it stays
    shell = parent_of_command(box)
    result = box.exec("echo started; setsid sleep 2042 > /dev/null 2>&1 & sleep 2043", 1.5)
    assert result.timed_out and result.exit_code == -9 and result.output == "started\n"
    left = box.exec(PS, 30).output
    assert "sleep 2042" not in left and "sleep 2043" not in left and "sleep 1042" in left
    assert parent_of_command(box) == shell


def test_a_command_that_kills_the_shell_fails_alone_and_the_next_gets_a_new_one(box):
    box.exec("echo kept > f; setsid sleep 1044 > /dev/null 2>&1 &", 30)
    shell = parent_of_command(box)
    with pytest.raises(SandboxError, match="the container's shell ended while the command ran"):
        box.exec("kill -9 $PPID; sleep 5", 30)
    assert box.exec("cat f", 30).output == "kept\n"
    assert parent_of_command(box) not in ("0", shell)
    assert "sleep 1044" in box.exec(PS, 30).output  # the container's processes are untouched


def test_the_runners_own_kill_everything_runs_alone_and_ends_the_shell(box):
    shell = parent_of_command(box)
    result = box.exec_alone("kill -9 -1; echo survived", 30)
    assert result.output == "survived\n" and result.exit_code == 0
    assert parent_of_command(box) not in ("0", shell)


def test_without_a_fifo_every_command_is_an_exec_of_its_own(made, docker_images):
    box = made(docker_images[0], env=(("TMPDIR", "/no/such/dir"),))
    assert box.exec("echo fine; exit 3", 30).output == "fine\n"
    assert parent_of_command(box) == "0" and box._resident.refused


def test_two_commands_at_once_both_run(box):
    results = {}
    slow = threading.Thread(target=lambda: results.update(slow=box.exec("sleep 2; echo slow", 30)))
    slow.start()
    time.sleep(0.5)
    start = time.monotonic()
    results["quick"] = box.exec("echo quick", 30)
    took = time.monotonic() - start
    slow.join()
    assert results["quick"].output == "quick\n" and results["slow"].output == "slow\n" and took < 1.5


def test_a_container_sandbox_is_freed_as_its_sample_drops_it_without_the_cyclic_collector(
    docker_run_name, docker_images
):
    """Its resident shell held it strongly: every docker sample's sandbox was a reference cycle, left for the
    cyclic collector (as in bwrap and local, test_resident_shell)."""
    spec = SandboxSpec(SandboxSettings(kind="docker"), image=docker_images[0], run_name=docker_run_name)

    def made_and_used():
        box = registry.get("docker").create(spec)
        assert box.exec("echo ran", 30).output == "ran\n"
        assert parent_of_command(box) != "0"  # the commands ran in the resident shell
        return box

    assert freed_without_the_collector(made_and_used), "the sandbox outlived its last reference: it is in a cycle"
