"""A stdio server started on the host: a shared server (once per worker), and every server's listing at start.

It gets the runner's PATH, HOME, USER and locale (not its credentials, withdrawn at start) plus the `env`
of its config, runs in its own process group, and dies with the process that started it: it is started
by the MCP loop's thread, which lives as long as its process, under the kernel's parent-death signal.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from agentbatch.mcp import loop
from agentbatch.mcp.config import ServerConfig

# The runner's variables a server on the host sees (the MCP SDK's list, and the locale).
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")


class CommandNotFound(Exception):
    """The server's command is not on PATH (or not an executable file)."""


class HostProcess:
    """A server process on the host: Popen's pipes and poll, and a kill of its whole process group."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.stdin, self.stdout, self.stderr = popen.stdin, popen.stdout, popen.stderr

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


def environment(server: ServerConfig) -> dict[str, str]:
    return {**{k: os.environ[k] for k in INHERITED if k in os.environ}, **server.env}


def start(server: ServerConfig) -> HostProcess:
    """Start the server's command on the host; CommandNotFound, or OSError when it cannot be started."""
    assert server.command is not None
    path = shutil.which(server.command)
    if path is None:
        raise CommandNotFound(f"command {server.command!r} not found on PATH")
    argv = [path, *server.args]
    setpriv = shutil.which("setpriv")
    if setpriv:  # dies with the MCP loop's thread, which dies with its process
        argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]

    async def spawn() -> HostProcess:
        # On the loop's thread, the parent-death signal's "parent": a sample's thread may end before its process.
        return HostProcess(
            subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=environment(server),
                cwd=server.cwd,
                start_new_session=True,
                close_fds=True,
            )
        )

    return loop.run(spawn(), 30.0)
