"""(23) What one terminal command costs the machine, by the way it is started: every candidate in one run.

A candidate is a way to run a sample's commands: a sandbox made for every command (as before issue 38), a
fork of the sample's resident shell (agentbatch/sandboxes/resident.py) sourcing the text, that fork `eval`ing
it (the resident shell before 2026-12-06), that shell exec'ing `bash -c` for each command, or the sandbox's
namespaces entered again for each command (nsenter, prlimit, bash: a lower bound of that way, since what the command starts would still need ending: a PID namespace of its own takes
a capability the entered user namespace does not give a process that is not its root).

Each candidate runs in a fresh child process: 64 sandboxes at once (one thread each, as 64 samples of a
worker), each running K commands (`pwd; ls /`) one after the other, then removed. K = 1 and K = 21 (Docker too):
the difference, divided by 64 × 20, is what one command costs beyond its sandbox; the K = 1 run, divided by 64,
what a sample's sandbox costs with one command. (With K = 6, the K = 1 run's own variation, 64 sandbox starts of
~15 ms each, divided over 320 commands, moved a command's figure by ±0.3 ms from one round to the next.)
Two measures of CPU, both kernel included:
- the child's cgroup's (v2 `cpu.stat`; every process the child starts stays in it, orphans a namespace's
  PID 1 reaps included, and no other engineer's is in it), or where no cgroup can be made,
  getrusage(RUSAGE_CHILDREN) around the child (which misses processes reaped outside the tree);
- the machine's, as (19s) measured it: /proc/stat's busy time over the run, every process and the kernel's
  own threads included (the work the kernel does after a namespace's last process left shows only there),
  and whatever else the machine runs: read it with the load beside it.
The first candidate is the floor of this machine at the time: the command in a subshell of a plain bash loop,
no runner and no sandbox (this VM runs faster or slower by ~15 % from one hour to the next: read the others
against it). The candidates take turns, `rounds` times; the median of each is printed. Docker's candidates run 8
containers at once (the engine's best parallelism here, (12)), in the busybox test image; most of their work
is the engine's (dockerd, containerd, runc), outside the child's cgroup: only the machine's figure has it.

    python bench/run_bench.py --only 23
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COMMAND = "pwd; ls /"
SANDBOXES, COMMANDS = 64, 21
DOCKER_IMAGE = "br-test-busybox:1"  # tests/build_test_image.sh: busybox only, no Python in it


def _bwrap(spec_kind: str):
    from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec
    from agentbatch.sandboxes.bwrap import BwrapSandbox

    return BwrapSandbox(SandboxSpec(SandboxSettings(kind="bwrap")))


def _docker():
    from agentbatch import plugins
    from agentbatch.sandboxes import registry
    from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec

    plugins.load(())  # the built-in backends, as a run loads them before any sandbox is asked for

    spec = SandboxSpec(SandboxSettings(kind="docker"), image=DOCKER_IMAGE, run_name="bench-command-cost")
    return registry.get("docker").create(spec)


def _local():
    from agentbatch.sandboxes.local import LocalSandbox

    return LocalSandbox(containment_method="pidns")


def _resident_variant(run: str) -> None:
    """The resident shell running each command's text with `run` (after the call that readies its shell) instead of
    sourcing it: `exec /bin/bash -c` of the text, or `eval` of it (the resident shell before 2026-12-06)."""
    from agentbatch.sandboxes import resident, shell_program

    plain = shell_program.runner_script

    def script(*args):
        text = f'{shell_program.ENTER}; {run} "$BASH_EXECUTION_STRING"'
        return plain(*args).replace(f". {shell_program.NAMED}", text)

    resident.runner_script = script  # as the resident shell calls it


class _Nsenter:
    """A bwrap sandbox whose resident shell only idles; each command enters its namespaces again from the host."""

    def __init__(self):
        self.box = _bwrap("bwrap")
        self.box.exec("true", 30)  # its shell is up: PID 1 of the namespaces to enter
        monitor = self.box._shell.current._proc.pid
        with open(f"/proc/{monitor}/task/{monitor}/children") as f:
            self.target = f.read().split()[0]

    def exec(self, command: str, timeout: float):
        from agentbatch.sandboxes.output import stream

        s = self.box.settings
        uid, gid = (str(i) for i in self.box._user or (os.getuid(), os.getgid()))
        argv = ["nsenter", "-t", self.target, "-U", "-m", "-p", "-i", "-u", "-w", "-S", uid, "-G", gid, "--"]
        argv += ["prlimit", f"--nproc={s.processes}", f"--data={s.memory_bytes}", f"--fsize={s.file_size_bytes}"]
        argv += [f"--cpu={s.cpu_seconds}", "--", "/bin/bash", "-c", command]
        return stream(argv, env=self.box._env, cwd="/", timeout=timeout, kill=lambda p: p.kill())

    def cleanup(self) -> None:
        self.box.cleanup()


CANDIDATES = {
    "no sandbox, no runner: a plain bash loop's `( ... )` (the floor)": ("bare", "loop"),
    "bwrap, a sandbox per command (before)": ("bwrap", "apart"),
    "bwrap, a fork of the sample's resident shell": ("bwrap", "resident"),
    "bwrap, the resident shell evals the text (before 2026-12-06)": ("bwrap", "eval"),
    "bwrap, the resident shell execs bash -c": ("bwrap", "exec-bash"),
    "bwrap, namespaces entered again per command (nsenter, lower bound)": ("bwrap", "nsenter"),
    "local, containment per command (before)": ("local", "apart"),
    "local, a fork of the sample's resident shell": ("local", "resident"),
    "local, the resident shell evals the text (before 2026-12-06)": ("local", "eval"),
    "local, the resident shell execs bash -c": ("local", "exec-bash"),
    "docker, an exec per command (before)": ("docker", "apart"),
    "docker, the container's resident shell": ("docker", "resident"),
}
VARIANTS = {"exec-bash": "exec /bin/bash -c", "eval": "eval"}  # how the variants run the text
DOCKER_SANDBOXES, DOCKER_COMMANDS = 8, 21  # containers at once: the engine's best parallelism here, (12)


def _sandboxes(name: str) -> int:
    return DOCKER_SANDBOXES if CANDIDATES[name][0] == "docker" else SANDBOXES


def _commands(name: str) -> int:
    """Commands per sandbox of the longer run: enough that they, not the sandboxes' making, are measured."""
    return DOCKER_COMMANDS if CANDIDATES[name][0] == "docker" else COMMANDS


def child(name: str, commands: int) -> None:
    """In the child process: SANDBOXES sandboxes at once, `commands` commands each, then removed."""
    kind, how = CANDIDATES[name]
    if how in VARIANTS:
        _resident_variant(VARIANTS[how])

    def one(_i: int) -> None:
        if kind == "bare":  # one bash per "sandbox", the command in a subshell of its loop `commands` times
            loop = f"for ((i = 0; i < {commands}; i++)); do ( {COMMAND} ) > /dev/null; done"
            subprocess.run(["/bin/bash", "-c", loop], check=True, cwd="/")
            return
        makers = {"bwrap": lambda: _bwrap(kind), "local": _local, "docker": _docker}
        box = _Nsenter() if how == "nsenter" else makers[kind]()
        run = box._exec_apart if how == "apart" else box.exec
        try:
            for _ in range(commands):
                result = run(COMMAND, 30)
                code = getattr(result, "exit_code", getattr(result, "returncode", None))
                assert code == 0, result
        finally:
            box.cleanup()

    with ThreadPoolExecutor(_sandboxes(name)) as pool:
        list(pool.map(one, range(_sandboxes(name))))


def _machine_busy() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")


def _new_cgroup() -> str | None:
    """A cgroup (v2) below this process's own for one child run, or None where none can be made."""
    from agentbatch.sandboxes import containment

    base = containment.cgroup_base()
    if base is None:
        return None
    path = os.path.join(base, f"br-bench-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.mkdir(path)
    except OSError:
        return None
    return path


def _cgroup_seconds(path: str) -> float:
    with open(os.path.join(path, "cpu.stat")) as f:
        usage = next(line.split()[1] for line in f if line.startswith("usage_usec"))
    return int(usage) / 1e6


def _measure(name: str, commands: int) -> tuple[float, float]:
    """(the child's CPU, the machine's CPU) seconds of one child run."""
    cgroup = _new_cgroup()
    before, busy = resource.getrusage(resource.RUSAGE_CHILDREN), _machine_busy()
    argv = [sys.executable, __file__, "child", name, str(commands), cgroup or ""]
    subprocess.run(argv, check=True, cwd=ROOT)
    after, busy_after = resource.getrusage(resource.RUSAGE_CHILDREN), _machine_busy()
    tree = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if cgroup is not None:
        tree = _cgroup_seconds(cgroup)
        os.rmdir(cgroup)
    return tree, busy_after - busy


def bench_command_cost(results: dict, rounds: int = 3) -> None:
    """(23) every candidate's CPU per command and per sandbox, taking turns; the medians reported."""
    from common import report

    per_command: dict[str, list[tuple[float, float]]] = {name: [] for name in CANDIDATES}
    per_sandbox: dict[str, list[float]] = {name: [] for name in CANDIDATES}
    before = os.getloadavg()[0]  # the machine's load before this bench added its own
    loads = []
    for _ in range(rounds):
        for name in CANDIDATES:
            loads.append(os.getloadavg()[0])
            one = _measure(name, 1)
            many = _measure(name, _commands(name))
            n = _sandboxes(name) * (_commands(name) - 1)
            per_command[name].append(((many[0] - one[0]) / n, (many[1] - one[1]) / n))
            per_sandbox[name].append(one[0] / _sandboxes(name))
    figures = {}
    for name in CANDIDATES:
        tree = statistics.median(t for t, _ in per_command[name]) * 1000
        machine = statistics.median(m for _, m in per_command[name]) * 1000
        sandbox = statistics.median(per_sandbox[name]) * 1000
        figures[name] = {"tree_ms": tree, "machine_ms": machine, "sandbox_and_one_command_ms": sandbox}
        report(
            results,
            "command_cost",
            f"(23) {name}: a command `{COMMAND}` {machine:.2f} ms of the machine's CPU ({tree:.2f} ms its own "
            f"processes'), a sandbox with one command {sandbox:.1f} ms (its own), {_sandboxes(name)} sandboxes at once, median "
            f"of {rounds} (load {before:.1f} before the bench, {min(loads):.1f}-{max(loads):.1f} at its runs' starts)",
        )
    results["command_cost"] = figures


if __name__ == "__main__":
    if sys.argv[1] == "child":
        if sys.argv[4]:  # this process, and all it starts, in the run's cgroup
            with open(os.path.join(sys.argv[4], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        child(sys.argv[2], int(sys.argv[3]))
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        bench_command_cost({}, rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
