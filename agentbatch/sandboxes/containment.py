"""How the local sandbox makes sure nothing a command started outlives it, best method first.

- `pidns`: the command runs as PID 1 of a new PID namespace (`unshare --pid --fork --kill-child`, under
  `setpriv --pdeathsig KILL` so a dead worker takes it along). When its shell exits, or is killed at the
  timeout, the kernel kills everything left in the namespace; no process can leave a PID namespace.
- `cgroup`: the command runs in a cgroup (v2) of its own below the worker's; `cgroup.kill` ends every
  process in it, however it was started.
- `scan`: the fallback where neither is allowed: the command's processes carry a tag in their environment
  and are found by scanning /proc. A process that drops the tag (`env -i`) escapes it.

Each method ends what a command started when the command ends (or times out), so a background process
never outlives its command. The method is probed once per process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time

METHODS = ("pidns", "cgroup", "scan")
TAG_VAR = "BR_SANDBOX_ID"
_probe_lock = threading.Lock()
_probed: dict[str, bool] = {}


class Command:
    """One command's containment: the argv that runs it, and how to end what it left."""

    def __init__(self, method: str, command: str, tag: str, cgroup: str | None = None):
        self.method = method
        self.tag = tag
        self.cgroup = cgroup
        shell = ["/bin/bash", "-c", command]
        if method == "pidns":
            self.argv = [*namespace_prefix(), *shell]
        elif method == "cgroup":
            # The shell moves itself into the cgroup before it runs anything, so every descendant starts there.
            enter = 'echo $$ > "$0/cgroup.procs" || exit 125; exec /bin/bash -c "$1"'
            self.argv = ["/bin/sh", "-c", enter, cgroup, command]
        else:
            self.argv = shell

    @property
    def settle(self):
        """What to run once the shell has exited (None: nothing can be left, the namespace died with it)."""
        return None if self.method == "pidns" else self.end

    def kill(self, proc: subprocess.Popen) -> None:
        """At the timeout: end the shell and everything it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # unshare in pidns mode: its child, PID 1, follows
        self.end()

    def end(self) -> None:
        if self.method == "cgroup":
            kill_cgroup(self.cgroup)
        elif self.method == "scan":
            kill_tagged_until_none({self.tag})


def namespace_prefix() -> list[str]:
    """What runs a program as PID 1 of a PID namespace of its own that dies with its worker (the pidns method)."""
    return ["setpriv", "--pdeathsig", "KILL", "--", *_unshare(), "--"]


def _unshare() -> list[str]:
    # Root may make a PID namespace directly; anyone else needs a user namespace to hold it.
    user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
    return ["unshare", "--pid", "--fork", "--kill-child", *user]


def usable(method: str) -> bool:
    """Whether the method works in this process (probed once)."""
    with _probe_lock:
        if method not in _probed:
            _probed[method] = _probe(method)
        return _probed[method]


def best() -> str:
    return next(m for m in METHODS if m == "scan" or usable(m))


def _probe(method: str) -> bool:
    if method == "scan":
        return True
    if method == "pidns":
        try:
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *_unshare(), "--", "/bin/sh", "-c", "exit 0"]
            return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
    base = cgroup_base()
    if base is None:
        return False
    probe = os.path.join(base, f"br-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
    except OSError:
        return False
    try:
        return os.path.exists(os.path.join(probe, "cgroup.kill"))
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


def cgroup_base() -> str | None:
    """This process's own cgroup v2 directory, if there is a cgroup2 hierarchy and it is writable."""
    try:
        with open("/proc/self/cgroup") as f:
            own = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return None
    if own is None:
        return None
    for fields in mounts:
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup2":
            path = os.path.join(fields[4], own.lstrip("/"))
            return path if os.access(path, os.W_OK) else None
    return None


def new_cgroup(name: str) -> str:
    path = os.path.join(cgroup_base() or "", name)
    os.mkdir(path)
    return path


def kill_cgroup(path: str | None, wait: float = 2.0) -> None:
    """Kill every process in the cgroup and remove it; never raises."""
    if not path or not os.path.isdir(path):
        return
    with contextlib.suppress(OSError):
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
    deadline = time.monotonic() + wait
    while True:
        try:
            os.rmdir(path)  # EBUSY until the last killed process is gone
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def cgroups_named(prefixes: set[str]) -> list[str]:
    """The cgroups below this process's own whose names start with one of the prefixes."""
    base = cgroup_base()
    if not base or not prefixes:
        return []
    with contextlib.suppress(OSError):
        return [os.path.join(base, n) for n in os.listdir(base) if any(n.startswith(p) for p in prefixes)]
    return []


def kill_tagged_until_none(tags: set[str], wait: float = 2.0) -> None:
    """kill_tagged again until two passes in a row, 10 ms apart, find no process with the tags (or `wait` is up).

    One pass can miss one: a process forked after /proc was listed, or one in the middle of an exec, whose
    environment cannot be read for that instant (the full suite's load showed a `setsid sleep` outliving its
    command's end that way). Never raises.
    """
    deadline = time.monotonic() + wait
    clean = 0
    while clean < 2 and time.monotonic() < deadline:
        clean = clean + 1 if kill_tagged(tags) == 0 else 0
        if clean < 2:
            time.sleep(0.01)


def kill_tagged(tags: set[str], nested: bool = False) -> int:
    """SIGKILL every process whose environment carries one of these sandbox tags; how many (Linux /proc).

    `nested`: also the tags below them (`<tag>/...`, a sandbox's long-lived processes).
    """
    if not tags:
        return 0
    prefix = f"{TAG_VAR}=".encode()
    wanted = {t.encode() for t in tags}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    killed = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found = [v[len(prefix) :] for v in f.read().split(b"\0") if v.startswith(prefix)]
            if not any(v in wanted or (nested and v.partition(b"/")[0] in wanted) for v in found):
                continue
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except (OSError, ValueError):
            pass  # gone, or not ours to read
    return killed
