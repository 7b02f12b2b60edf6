"""Keep the runner's secrets out of /proc/<pid>/cmdline and /proc/<pid>/environ, where sandboxed commands look.

Credentials in the environment (any variable named like *KEY*, *TOKEN*, *SECRET*, *PASSWORD*) are withdrawn
from os.environ when a run starts, so no process the runner starts (workers, multiprocessing's resource
tracker, the local model server, Chromium) inherits them; the tools read them with getenv(), and workers get
them inside their config. What stays visible is the runner's own initial environment block, masked below.

A local sandbox runs commands as the runner's own user, so `ps aux` or `cat /proc/*/environ` would show an
API key passed as `--api_key=...` or inherited in the environment. The kernel serves those two files straight
from the process's memory (the argv and initial environment blocks), so overwriting the secret there hides it.
Python's own copies (sys.argv, os.environ) are unaffected.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
_held: dict[str, str] = {}


def looks_secret(name: str) -> bool:
    return any(w in name.upper() for w in SECRET_WORDS)


def withdraw_environment() -> dict[str, str]:
    """Move every credential-like variable out of os.environ (and out of this process's /proc); returns them."""
    withdrawn = {k: os.environ.pop(k) for k in list(os.environ) if looks_secret(k)}
    hold(withdrawn)
    return withdrawn


def hold(variables: Mapping[str, str]) -> None:
    """Keep withdrawn variables for getenv() (in a worker: the ones its config carries) and mask them in /proc."""
    _held.update(variables)
    hide_from_proc(v for v in variables.values() if len(v) >= 8)


def getenv(name: str, default: str | None = None) -> str | None:
    """os.environ's value, else a withdrawn one, else default."""
    return os.environ.get(name) or _held.get(name) or default


# /proc/<pid>/stat fields 48-51 (1-based, since Linux 3.5): arg_start, arg_end, env_start, env_end.
_FIRST_FIELD = 48


def memory_ranges(pid: str | int = "self") -> list[tuple[int, int]]:
    """The (start, end) addresses of a process's argv and initial environment blocks; [] when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # Field 2 (the command name) may hold spaces and parentheses: count fields after its closing ")".
    rest = stat[stat.rfind(b")") + 2 :].split()
    first = _FIRST_FIELD - 3
    if len(rest) < first + 4:
        return []
    try:
        arg_start, arg_end, env_start, env_end = (int(v) for v in rest[first : first + 4])
    except ValueError:
        return []
    return [(s, e) for s, e in ((arg_start, arg_end), (env_start, env_end)) if 0 < s < e]


def hide_from_proc(secrets: Iterable[str]) -> int:
    """Overwrite each secret in this process's argv and environment memory with '*'; best effort, never raises.

    Returns how many occurrences were overwritten. Linux only (elsewhere it does nothing).
    """
    needles = sorted({s.encode("utf-8", "surrogateescape") for s in secrets if s}, key=len, reverse=True)
    if not needles or not sys.platform.startswith("linux"):
        return 0
    hidden = 0
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in memory_ranges():
                mem.seek(start)
                block = mem.read(end - start)
                changed = block
                for needle in needles:
                    hidden += changed.count(needle)
                    changed = changed.replace(needle, b"*" * len(needle))
                if changed != block:
                    mem.seek(start)
                    mem.write(changed)
    except (OSError, ValueError, OverflowError):
        return hidden
    return hidden
