"""How a bwrap sandbox's first process becomes the sandbox's user (nobody) when the runner is root, cheaply.

Every sample's sandbox starts with one program before bwrap that drops the runner's root: its groups cleared,
its gid and uid set (real, effective and saved). That program's exec is a share of each sample's start, so
it is the lightest that does it: coreutils' `chroot --userspec=+UID:+GID --groups= --skip-chdir /` (numeric
ids: no user database is read; `/` is the root it already has), where `setpriv` loaded libcap-ng and read
the user and group databases and its capabilities; and either reads the locale files of the sandbox's
LC_ALL at every start, so it runs with LC_ALL=C and bwrap gives the sandbox its own back (`--setenv`).
Measured on two cores (bench/RESULTS.md, issue 38): setpriv 2.0-2.3 ms of the machine's CPU with
`/bin/true` after it, chroot 1.7 ms, chroot with LC_ALL=C 1.4 ms, `/bin/true` alone 0.7 ms.

chroot is tried once per process; where it is refused (no CAP_SYS_CHROOT) setpriv does it, as before.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

from agentbatch.sandboxes.shell_program import LOCALE

_lock = threading.Lock()
_chosen: dict[tuple[int, int], list[str] | None] = {}


def prefix(uid: int, gid: int) -> list[str] | None:
    """The command line that runs the rest as uid:gid with no supplementary group; None if none works here."""
    with _lock:
        if (uid, gid) not in _chosen:
            _chosen[(uid, gid)] = _choose(uid, gid)
        return _chosen[(uid, gid)]


def _choose(uid: int, gid: int) -> list[str] | None:
    chroot, setpriv = shutil.which("chroot"), shutil.which("setpriv")
    if chroot:
        line = [chroot, f"--userspec=+{uid}:+{gid}", "--groups=", "--skip-chdir", "/"]
        try:
            tried = subprocess.run([*line, "/bin/sh", "-c", "exit 0"], capture_output=True, env={LOCALE: "C"})
        except OSError:
            tried = None
        if tried is not None and tried.returncode == 0:
            return line
    if setpriv:
        return [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return None


def environment(env: dict[str, str]) -> tuple[dict[str, str], bytes]:
    """The environment to start the program before bwrap with (LC_ALL=C: no locale files read), and bwrap's
    options (for its --args pipe) that give the sandbox `env`'s own LC_ALL back, or none."""
    value = env.get(LOCALE)
    back = f"--unsetenv\0{LOCALE}\0" if value is None else f"--setenv\0{LOCALE}\0{value}\0"
    return {**env, LOCALE: "C"}, back.encode("utf-8", "surrogateescape")
