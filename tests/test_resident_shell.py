"""A sample's resident shell (sandboxes/resident.py): its commands are forks of it, and each gets what it had.

In the real bwrap and local (PID namespace) sandboxes: a command sees what a `bash -c` of its own saw (its
environment, limits, line numbers, no descriptor or variable of the shell's), runs in a process group of its
own, and leaves nothing behind (no process, no output in the next command's); the shell is out of its
commands' reach; a shell that dies under a command fails that command only, a timeout ends the shell and
the next command gets a new one; two commands at once both run. Outside a PID namespace the shell never
kills "every process". A sandbox is freed as its sample drops it (its shell's factory makes no reference
cycle). Through the real CLI: kill -9 of the runner leaves no shell and no namespace behind,
and the next session's reap removes the sample's directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from cli_helpers import assert_clean_exit, run_cli, start_cli, write_dataset
from sandbox_support import alive, create, freed_without_the_collector, new_marker, pids_with, spec_for, wait_gone
from scripted_server import ScriptedServer

from agentbatch.sandboxes import sandbox_dirs, shell_program
from agentbatch.sandboxes.base import SandboxError
from agentbatch.sandboxes.resident import ResidentShell, ShellStart

RESIDENT = ("bwrap", "local-pidns")


@pytest.fixture(params=RESIDENT)
def sandbox(request):
    made = create(spec_for(request.param))
    made.kind = request.param
    yield made
    made.cleanup()


def children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def shell_pid(sandbox) -> int:
    """The host PID of the sample's resident shell (the child of bwrap, or of unshare)."""
    (pid,) = children(sandbox._shell.current.pid)
    return pid


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def namespace_init(pid: int) -> int:
    """The host PID of the PID 1 of the process's PID namespace: the resident shell of its sandbox."""
    while True:
        with open(f"/proc/{pid}/status") as f:
            ns_pids = next(line for line in f if line.startswith("NSpid:")).split()[1:]
        if len(ns_pids) > 1 and ns_pids[-1] == "1":
            return pid
        assert len(ns_pids) > 1, f"{pid} is in no PID namespace of its own"
        pid = ppid(pid)


PROBE = "; ".join(
    [
        'echo "$0 $# $-"',
        "declare -p OLDPWD PWD SHLVL HOME TMPDIR PATH LANG LC_ALL TERM",
        "env | grep -v '^_=' | sort",
        "ulimit -a",
        "grep -E 'SigIgn|SigBlk|NoNewPrivs|CapEff' /proc/self/status",
        "cat /proc/self/oom_score_adj",
        "ls /proc/self/fd",
        "umask",
        "pwd",
    ]
)


def test_a_command_gets_what_a_bash_c_of_its_own_got(sandbox):
    """Environment, limits, signals, descriptors, working directory: the same as the sandbox of its own."""
    resident = sandbox.exec(PROBE, timeout=30)
    apart = sandbox._exec_apart(PROBE, timeout=30)
    assert resident.exit_code == apart.exit_code == 0, (resident, apart)
    assert resident.output == apart.output
    assert sandbox._shell.current is not None and not sandbox._shell.current.dead  # the first ran in the resident shell
    # Line numbers are the command's own, its exit code too; nothing of the shell's own is in its variables or
    # functions. Its text is sourced as `bash`: bash's messages name `bash` where a `bash -c` of its own named
    # `/bin/bash` ($0, the same in both), never a path of the runner's.
    result = sandbox.exec("true\nno-such-command-here\nset | grep -c '^__br' ; declare -F; exit 7", timeout=30)
    assert result.output == "bash: line 2: no-such-command-here: command not found\n0\n" and result.exit_code == 7
    syntax = sandbox.exec("echo ran\nif then", timeout=30)  # what precedes a syntax error runs, as in `bash -c`
    assert syntax.output == "ran\nbash: line 2: syntax error near unexpected token `then'\nbash: line 2: `if then'\n"
    assert syntax.exit_code == 2 == sandbox._exec_apart("echo ran\nif then", timeout=30).exit_code
    # On the first line, the line shown holds the call that readied the command's shell before the text ran.
    assert sandbox.exec("ls )", timeout=30).output.endswith("bash: line 1: `__br_enter; ls )'\n")
    assert sandbox.exec('echo "$BASH_EXECUTION_STRING"', timeout=30).output == 'echo "$BASH_EXECUTION_STRING"\n'
    quoted = "printf '%s|' 'it'\"'\"'s' \"$HOME\" '$HOME' \\\\; echo"
    assert sandbox.exec(quoted, timeout=30).output == sandbox._exec_apart(quoted, timeout=30).output
    with pytest.raises(ValueError, match="embedded null byte"):
        sandbox.exec("echo a\0b", timeout=30)
    assert sandbox.exec("echo still usable", timeout=30).output == "still usable\n"


# The reading process's PID and process group, from the /proc it sees (a local command sees the host's).
STAT = 'read -r l < /proc/self/stat; p=${l%% *}; set -- ${l##*") "}; echo "$p $3"'


def test_each_command_is_a_process_group_of_its_own(sandbox):
    command = f"{STAT}; sh -c '{STAT}'; sh -c '{STAT}' & wait"
    shell, child, background = (line.split() for line in sandbox.exec(command, timeout=30).output.splitlines())
    assert shell[0] == shell[1]  # the command's shell leads a group
    assert child[1] == background[1] == shell[1]  # and what it starts stays in it (no job control in a command)
    again = sandbox.exec(STAT, timeout=30).output.split()
    assert again[1] != shell[1]  # the next command is another group


def test_nothing_a_command_started_runs_into_the_next(sandbox):
    marker = new_marker()
    first = sandbox.exec(f"(while :; do echo leaked; sleep 0.001; done) & sleep {marker} & echo first", timeout=30)
    assert "first" in first.output.split() and set(first.output.split()) <= {"first", "leaked"}
    assert wait_gone(marker, 1.0) == []
    assert sandbox.exec("echo second", timeout=30).output == "second\n"


def test_the_shell_is_out_of_its_commands_reach():
    """It cannot be signalled, read or traced by its commands (bwrap's: a local command runs as the runner's
    user, and no boundary is promised there)."""
    sandbox = create(spec_for("bwrap"))
    try:
        _out_of_reach(sandbox)
    finally:
        sandbox.cleanup()


def _out_of_reach(sandbox) -> None:
    result = sandbox.exec(
        "kill -9 1; kill -TERM 1; kill -STOP 1; kill -9 -1; "
        "cat /proc/1/environ; ls /proc/1/fd; cat /proc/1/mem; echo after",
        timeout=30,
    )
    assert result.output.count("Permission denied") == 3 and result.output.endswith("after\n"), result.output
    # Nor can they take away what its later commands are read through (the names directory, /dev/.br).
    result = sandbox.exec(
        "rm -f /dev/.br/bash; ln -sf /etc/passwd /dev/.br/bash; chmod 777 /dev/.br; rmdir /dev/.br; "
        "mv /dev/.br /dev/x; rm -rf /dev/* 2>/dev/null; ls -A /dev/.br",
        timeout=30,
    )
    assert result.output.count("Read-only file system") == 3 and result.output.endswith("\nbash\n"), result.output
    assert "Device or resource busy" in result.output, result.output
    assert sandbox.exec("echo the shell is the same one", timeout=30).output == "the shell is the same one\n"


def test_a_shell_that_dies_under_a_command_fails_that_command_only(sandbox, tmp_path):
    other = create(spec_for(sandbox.kind))
    try:
        sandbox.exec("echo kept > f", timeout=30)
        killer = threading.Timer(1.0, lambda: os.kill(shell_pid(sandbox), signal.SIGKILL))
        killer.start()
        start = time.monotonic()
        with pytest.raises(SandboxError, match="the sandbox's shell ended while the command ran"):
            sandbox.exec("sleep 20", timeout=60)
        assert time.monotonic() - start < 10
        # The next command gets a new shell, over the same files; another sample never noticed.
        assert sandbox.exec("cat f", timeout=30).output == "kept\n"
        assert other.exec("echo untouched", timeout=30).output == "untouched\n"
    finally:
        other.cleanup()


def test_a_timeout_ends_the_shell_and_the_next_command_gets_a_new_one(sandbox):
    marker = new_marker()
    sandbox.exec("echo kept > f", timeout=30)
    first = shell_pid(sandbox)
    result = sandbox.exec(f"echo started; setsid sleep {marker} & sleep {marker}", timeout=1.5)
    assert result.timed_out and result.exit_code == -9 and result.output == "started\n"
    assert wait_gone(marker, 2.0) == []
    deadline = time.monotonic() + 2.0
    while alive(first) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(first)
    assert sandbox.exec("cat f", timeout=30).output == "kept\n"
    assert shell_pid(sandbox) != first


def test_two_commands_at_once_both_run(sandbox):
    """A tool's threads may run two commands of one sample at once: the second does not wait for the first."""
    results: dict[str, object] = {}
    slow = threading.Thread(target=lambda: results.update(slow=sandbox.exec("sleep 2; echo slow", timeout=30)))
    slow.start()
    time.sleep(0.5)
    start = time.monotonic()
    results["quick"] = sandbox.exec("echo quick", timeout=30)
    quick_took = time.monotonic() - start
    slow.join()
    assert results["quick"].output == "quick\n" and results["slow"].output == "slow\n"
    assert quick_took < 1.5


@pytest.mark.parametrize("kind", RESIDENT)
@pytest.mark.parametrize("command", [None, "true"])
def test_a_sandbox_is_freed_as_its_sample_drops_it_without_the_cyclic_collector(kind, command):
    # Its resident shell's factory closed over the sandbox: every sample's sandbox was a reference cycle, left for
    # the collector, whose collections then walked all 1,024 samples in flight (bench (10): +0.3 s of each
    # worker's CPU, +8 MiB).
    def made_and_used():
        made = create(spec_for(kind))
        if command is not None:
            assert made.exec(command, 30).exit_code == 0
            assert made._shell.current is not None  # the command ran in the resident shell
        return made

    assert freed_without_the_collector(made_and_used), "the sandbox outlived its last reference: it is in a cycle"


def test_outside_a_pid_namespace_the_shell_kills_no_other_process(tmp_path):
    """Its `kill -9 -1` is for PID 1 of a namespace only: here it would kill every process of the user."""
    marker = new_marker()
    bystander = subprocess.Popen(["sleep", marker])
    names = tmp_path / "names"
    names.mkdir()
    (names / "bash").symlink_to("/proc/self/fd/3")
    shell = ResidentShell(lambda: ShellStart([]), {"PATH": os.environ["PATH"]}, str(tmp_path), str(names))
    try:
        with shell.lock:
            done = shell.run("echo ran", timeout=30)
        assert done.returncode == 0 and done.output.text() == "ran\n"
        assert alive(bystander.pid) and pids_with(marker) == [bystander.pid]
    finally:
        shell.close()
        bystander.kill()
        bystander.wait()


def _pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def _in_namespace(namespace: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if _pid_namespace(int(name)) == namespace and alive(int(name)):
                    found.append(int(name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("kind", ["bwrap", "local"])
def test_kill_9_of_the_runner_leaves_no_shell_and_no_namespace_behind(tmp_path, kind):
    settings = spec_for("bwrap" if kind == "bwrap" else "local-pidns").settings  # skips where it cannot run
    # A TMPDIR of the run alone (the sandbox's user may pass through it), so its directories can be counted.
    private = Path(tempfile.mkdtemp(prefix="br-test-tmp-", dir="/tmp"))
    private.chmod(0o711)
    try:
        _kill_the_runner(tmp_path, settings, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _kill_the_runner(tmp_path, settings, private: Path) -> None:
    marker = new_marker()
    script = {"long": [{"tool_calls": [{"name": "terminal", "arguments": {"command": f"sleep {marker}"}}]}]}
    data = write_dataset(tmp_path / "ds.jsonl", ["long"])
    args = [f"--dataset_file={data}", "--batch_size=10", "--run_name=killed", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    args += [f"--sandbox={settings.kind}", "--command_timeout=120"]
    with ScriptedServer(script=script) as srv:
        runner = start_cli(args, tmp_path, srv, env={"TMPDIR": str(private)})
        try:
            deadline = time.monotonic() + 60
            while not pids_with(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            (command,) = pids_with(marker)
            shell = namespace_init(command)
            namespace = _pid_namespace(shell)
            assert [d.name for d in private.iterdir() if d.name.startswith("br-sandbox-")]
            runner.kill()  # the runner alone: its workers, and theirs, must die of it
            runner.wait(timeout=30)
            deadline = time.monotonic() + 30
            while (alive(shell) or _in_namespace(namespace)) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not alive(shell) and _in_namespace(namespace) == [] and pids_with(marker) == []
        finally:
            runner.kill()
        # The next session's start (of any run) reaps the dead worker's sample directory.
        srv.script["quick"] = [{"content": "done"}]
        quick = write_dataset(tmp_path / "quick.jsonl", ["quick"])
        again = run_cli(
            [f"--dataset_file={quick}", "--batch_size=10", "--run_name=next", *args[3:]],
            tmp_path,
            srv,
            env={"TMPDIR": str(private)},
        )
    assert_clean_exit(again)
    assert f"removed 1 {settings.kind} sandboxes whose worker had died" in again.stderr, again.stderr
    assert [d.name for d in private.iterdir() if d.name.startswith("br-sandbox-")] == []


def test_the_names_directory_lives_while_a_local_sandbox_holds_it_and_is_this_users_alone(tmp_path, monkeypatch):
    """Local shells read a command's text as `bash` in their process's br-sandbox-<owner>-names: made when the first
    local sandbox needs it, the link made again when a command removed it, gone when the last let go; refused when
    others may write to it. A dead process's is reaped with its sandboxes, and not counted as one."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(shell_program, "_names", {})  # none held by this process before
    first, second = create(spec_for("local-pidns")), create(spec_for("local-pidns"))
    assert first.exec("echo one", 30).output == "one\n" and second.exec("echo two", 30).output == "two\n"
    (names,) = tmp_path.glob("br-sandbox-*-names")
    assert os.readlink(names / "bash") == "/proc/self/fd/3" and names.stat().st_mode & 0o777 == 0o700
    first.cleanup()
    os.unlink(names / "bash")  # as a command of the user's could: the next sandbox's shell makes it again
    third = create(spec_for("local-pidns"))
    assert third.exec("no-such-command-here", 30).output == "bash: line 1: no-such-command-here: command not found\n"
    second.cleanup()
    assert names.exists()
    third.cleanup()
    assert not names.exists()  # the last holder gone
    names.mkdir(mode=0o777)
    names.chmod(0o777)  # anyone could swap the link: refused
    refused = create(spec_for("local-pidns"))
    with pytest.raises(SandboxError, match="not a directory of this user's alone"):
        refused.exec("true", 30)
    refused.cleanup()
    names.rmdir()
    dead = tmp_path / "br-sandbox-999999999.1-names"  # above any pid: a dead owner's
    dead.mkdir()
    monkeypatch.setattr(sandbox_dirs, "_bases", lambda: {str(tmp_path)})
    assert sandbox_dirs.reap_dead() == 0 and not dead.exists()
