"""A stdio server started on the host: a shared server (once per worker), and a shared server's listing at start.

It gets the runner's PATH, HOME, USER and locale (not its credentials, withdrawn at start) plus the `env`
of its config, runs in its own process group, and dies with the process that started it: it is started
by the MCP loop's thread, which lives as long as its process, under the kernel's parent-death signal.
Its pipes and bounded stderr are the sandboxes' own `PipeProcess`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess

from agentbatch.mcp import loop
from agentbatch.mcp.config import ServerConfig
from agentbatch.sandboxes.process import PipeProcess

# The runner's variables a server on the host sees (the MCP SDK's list, and the locale).
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")


class CommandNotFound(Exception):
    """The server's command is not on PATH (or not an executable file)."""


def environment(server: ServerConfig) -> dict[str, str]:
    return {**{k: os.environ[k] for k in INHERITED if k in os.environ}, **server.env}


def _kill_group(popen: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)


def start(server: ServerConfig) -> PipeProcess:
    """Start the server's command on the host (in its config's cwd); CommandNotFound, or OSError."""
    assert server.command is not None
    path = shutil.which(server.command)
    if path is None:
        raise CommandNotFound(f"command {server.command!r} not found on PATH")
    argv = [path, *server.args]
    setpriv = shutil.which("setpriv")
    if setpriv:  # dies with the MCP loop's thread, which dies with its process
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]

    async def spawn() -> PipeProcess:
        # On the loop's thread, the parent-death signal's "parent": a sample's thread may end before its process.
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment(server),
            cwd=server.cwd,
            start_new_session=True,
        )
        return PipeProcess(popen, _kill_group)

    return loop.run(spawn(), 30.0)
