"""A stdio server started on the host: a shared server (once per worker), and a shared server's listing at start.

It gets the runner's PATH, HOME, USER and locale (not its credentials, withdrawn at start) plus the `env`
of its config, runs in its own process group, and dies with the process that started it: it is started
by the MCP loop's thread, which lives as long as its process, under the kernel's parent-death signal.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading

from agentbatch.mcp import loop
from agentbatch.mcp.config import ServerConfig
from agentbatch.sandboxes.output import BoundedOutput

# The runner's variables a server on the host sees (the MCP SDK's list, and the locale).
INHERITED = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")
STDERR_KEPT = 64 * 1024  # bytes kept from each end of a server's stderr


class CommandNotFound(Exception):
    """The server's command is not on PATH (or not an executable file)."""


class HostProcess:
    """A server process on the host (a sandboxes.base.Process): its pipes, its stderr kept bounded, a kill."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.stdin, self.stdout = popen.stdin, popen.stdout
        self._errors = BoundedOutput(STDERR_KEPT)
        self._lock = threading.Lock()
        # Drained all along: a server whose stderr pipe filled up would stop.
        self._drainer = threading.Thread(target=self._drain, name="mcp-stderr", daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while data := self.popen.stderr.read1(65536):
                with self._lock:
                    self._errors.add(data)

    def stderr(self) -> str:
        with self._lock:
            return self._errors.text()

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        self._drainer.join(5)  # its pipe ended with the process group
        for pipe in (self.stdin, self.stdout, self.popen.stderr):
            with contextlib.suppress(OSError, ValueError):
                pipe.close()


def environment(server: ServerConfig) -> dict[str, str]:
    return {**{k: os.environ[k] for k in INHERITED if k in os.environ}, **server.env}


def start(server: ServerConfig, cwd: str | None = None) -> HostProcess:
    """Start the server's command on the host (in `cwd`, else its config's); CommandNotFound, or OSError."""
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
                cwd=cwd or server.cwd,
                start_new_session=True,
            )
        )

    return loop.run(spawn(), 30.0)
