"""Long-lived processes in a sample's sandbox (Sandbox.start), as an MCP server inside one uses them.

In every backend, real processes: what is written to `cat`'s stdin comes back on its stdout; EOF on
stdin ends it; commands run beside it and their ends leave it alone; it ends when killed or when its
sandbox is cleaned up, with everything it started; its stderr is kept bounded; a thread that started it
may end first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import conftest_docker
import pytest
from sandbox_support import KINDS, new_marker, pids_with, spec_for, wait_gone

from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import Process, Sandbox, SandboxSettings, SandboxSpec

docker_images = conftest_docker.docker_images
docker_run_name = conftest_docker.docker_run_name
ALL = [*KINDS, pytest.param("docker", marks=pytest.mark.docker)]


@pytest.fixture(params=ALL)
def made(request):
    """Make sandboxes of the parametrized kind; each is cleaned up through its backend when the test ends."""
    kind = request.param
    if kind == "docker":
        image = request.getfixturevalue("docker_images")[0]
        spec = SandboxSpec(
            SandboxSettings(kind="docker"), image=image, run_name=request.getfixturevalue("docker_run_name")
        )
    else:
        spec = spec_for(kind)
    backend = registry.get(spec.kind)
    sandboxes: list[Sandbox] = []

    def make() -> Sandbox:
        sandboxes.append(backend.create(spec))
        return sandboxes[-1]

    make.kind = kind
    make.cleanup = lambda sandbox: backend.cleanup(sandbox, interrupted=False)
    yield make
    for sandbox in sandboxes:
        backend.cleanup(sandbox, interrupted=False)


def reading(process: Process) -> Callable[[float], bytes]:
    """Start reading a line of the process's stdout on a thread of its own; the line, once it is there."""
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(process.stdout.readline()), daemon=True)
    reader.start()

    def line(timeout: float = 30) -> bytes:
        reader.join(timeout)
        assert got, f"no line from the process in {timeout} s; its stderr: {process.stderr()!r}"
        return got[0]

    return line


def read_line(process: Process, timeout: float = 30) -> bytes:
    """A line of the process's stdout; a hang fails the test instead of hanging it."""
    return reading(process)(timeout)


def wait_ended(process: Process, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while (code := process.poll()) is None:
        assert time.monotonic() < deadline, "the process did not end"
        time.sleep(0.05)
    return code


def talk(process: Process, line: bytes) -> bytes:
    process.stdin.write(line)
    process.stdin.flush()
    return read_line(process)


def test_what_is_written_comes_back_and_eof_ends_it(made):
    sandbox = made()
    cat = sandbox.start(["cat"])
    assert talk(cat, b"hello\n") == b"hello\n"
    assert talk(cat, bytes(range(1, 256)).replace(b"\n", b"") + b"\n").startswith(b"\x01\x02")
    cat.stdin.close()
    assert read_line(cat) == b""
    assert wait_ended(cat) == 0


def test_it_runs_beside_commands_in_the_same_files_and_its_own_environment(made):
    sandbox = made()
    sandbox.write_file("shared.txt", b"from the file tools\n")
    server = sandbox.start(["sh", "-c", 'echo "$GREETING"; cat shared.txt; cat'], env={"GREETING": "hi there"})
    assert read_line(server) == b"hi there\n"
    assert read_line(server) == b"from the file tools\n"
    # Commands start and end beside it (the local sandbox's end of a command kills what that command left).
    assert sandbox.exec("echo a command", timeout=30).output == "a command\n"
    assert sandbox.exec("sleep 1 & echo backgrounded", timeout=30).output.endswith("backgrounded\n")
    assert talk(server, b"still here\n") == b"still here\n"
    assert server.poll() is None
    assert "GREETING" not in sandbox.exec("env", timeout=30).output  # its env is its own


def test_it_ends_with_its_sandbox_with_everything_it_started(made):
    sandbox = made()
    marker = new_marker()
    server = sandbox.start(["sh", "-c", f"sleep {marker} & setsid sleep {marker}1 & cat"])
    assert talk(server, b"up\n") == b"up\n"
    if made.kind != "docker":  # a container's processes are not the host's to look at
        assert len(pids_with(marker)) >= 2
    line = reading(server)  # a reader waits for its next line, as an MCP client does
    made.cleanup(sandbox)
    assert line() == b""
    assert wait_ended(server) != 0
    assert wait_gone(marker, 2.0) == []


def test_kill_ends_it_and_what_it_started_and_the_sandbox_goes_on(made):
    sandbox = made()
    marker = new_marker()
    server = sandbox.start(["sh", "-c", f"setsid sleep {marker} & cat"])
    other = sandbox.start(["cat"])
    assert talk(server, b"up\n") == b"up\n"
    server.kill()
    server.kill()  # twice is harmless
    assert wait_ended(server) != 0
    assert wait_gone(marker, 2.0) == []
    if made.kind == "docker":
        assert marker not in sandbox.exec("ps -o args", timeout=30).output
    assert talk(other, b"the other one lives\n") == b"the other one lives\n"
    assert sandbox.exec("echo usable", timeout=30).output == "usable\n"


def test_its_stderr_is_bounded_and_never_blocks_it(made):
    sandbox = made()
    noisy = sandbox.start(["sh", "-c", "head -c 9000000 /dev/zero | tr '\\0' e >&2; echo done; cat"])
    assert read_line(noisy, timeout=60) == b"done\n"
    deadline = time.monotonic() + 30  # Docker may deliver stdout's frames before the last of stderr's
    while "bytes cut" not in (errors := noisy.stderr()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert errors.startswith("eee") and errors.endswith("eee") and "bytes cut" in errors
    assert len(errors) < 5 * 2**20


def test_a_command_that_cannot_run_ends_at_once_saying_why(made):
    sandbox = made()
    missing = sandbox.start(["no-such-command-4711"])
    assert read_line(missing) == b""
    assert wait_ended(missing) == 127
    assert "no-such-command-4711" in missing.stderr()


def test_the_thread_that_started_it_may_end_first(made):
    """A worker's pool thread may start a server and end: the process is tied to its worker, not that thread."""
    sandbox = made()
    started: list[Process] = []
    starter = threading.Thread(target=lambda: started.append(sandbox.start(["cat"])))
    starter.start()
    starter.join()
    time.sleep(0.5)
    assert talk(started[0], b"after its thread\n") == b"after its thread\n"


WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from agentbatch import plugins
from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec
plugins.load()  # as a worker's start does
spec = SandboxSpec(SandboxSettings(kind=sys.argv[2], local_containment=sys.argv[3] or None))
server = registry.get(spec.kind).create(spec).start(["sh", "-c", "sleep " + sys.argv[4] + " & cat"])
server.stdin.write(b"up\\n")
server.stdin.flush()
print(server.stdout.readline().decode(), end="", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("kind", ["bwrap", "local-pidns"])
def test_it_dies_with_its_worker_with_everything_it_started(kind):
    """A worker killed with -9 cleans nothing up: the kernel ends its sandboxes' processes with it."""
    import subprocess
    import sys

    from cli_helpers import ROOT

    settings = spec_for(kind).settings  # skips where the machine cannot make it
    marker = new_marker()
    args = [str(ROOT), settings.kind, settings.local_containment or "", marker]
    worker = subprocess.Popen([sys.executable, "-c", WORKER, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline() == "up\n"
        assert pids_with(marker)
        worker.kill()
        worker.wait()
        assert wait_gone(marker, 3.0) == []
    finally:
        worker.kill()
