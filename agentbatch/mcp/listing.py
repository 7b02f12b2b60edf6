"""Every server's tool list, read once per run at start (in the runner, before any model call).

Each server is started as its samples will start it, asked for its tools and closed, all servers at once.
A server that cannot be started, does not answer in time, or lists tools that cannot be offered stops
the run with one line naming it; nothing has been spent yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager

from agentbatch.errors import FatalError
from agentbatch.mcp import host, loop, schemas, servers
from agentbatch.mcp.config import ServerConfig
from agentbatch.mcp.connection import Connection, ServerError
from agentbatch.mcp.pipes import ServerProcess
from agentbatch.sandboxes.base import SandboxError, SandboxSpec
from agentbatch.sandboxes.process import stop_lasting_thread
from agentbatch.sandboxes.sample import SampleSandbox

# How a stdio server that runs in the samples' sandboxes is started for its listing: in a sandbox of the run's
# kind, made for it and removed after (launch gives one); by default on the host.
Starter = Callable[[ServerConfig], AbstractContextManager[ServerProcess]]


@contextlib.contextmanager
def on_host(server: ServerConfig) -> Iterator[ServerProcess]:
    process = host.start(server)
    try:
        yield process
    finally:
        process.kill()


def in_sandboxes(spec: SandboxSpec) -> Starter:
    """A starter of each server in a sandbox of the run's kind, made for its listing and removed after."""

    @contextlib.contextmanager
    def start(server: ServerConfig) -> Iterator[ServerProcess]:
        box = SampleSandbox(spec)
        try:
            box.backend.prepare(spec)
            process = servers.start_in_sandbox(box.get(), server)
            try:
                yield process
            finally:
                process.kill()
        finally:
            box.close()

    return start


def list_tools(
    servers: tuple[ServerConfig, ...], timeout: float, starter: Starter = on_host
) -> tuple[schemas.McpTool, ...]:
    """The tools of every server, in config order; FatalError naming the first server that fails."""
    try:
        with ThreadPoolExecutor(max_workers=min(8, len(servers)), thread_name_prefix="mcp-list") as pool:
            results = list(pool.map(lambda s: _one(s, timeout, starter), servers))
    finally:  # the runner is one thread again when it forks its workers
        loop.stop()
        stop_lasting_thread()
    tools: list[schemas.McpTool] = []
    for server, outcome in zip(servers, results, strict=True):
        if isinstance(outcome, str):
            raise FatalError(f"--mcp_config: server {server.name!r} {outcome}")
        tools += outcome
    return tuple(tools)


def _one(server: ServerConfig, timeout: float, starter: Starter) -> tuple[schemas.McpTool, ...] | str:
    """The server's offered tools, or why not (the rest of a one-line error)."""
    with contextlib.ExitStack() as stack:
        process = None
        if server.transport == "stdio":
            try:
                process = stack.enter_context((starter if server.in_sandbox else on_host)(server))
            except host.CommandNotFound as e:
                return f"cannot start: {e}"
            except (OSError, SandboxError) as e:
                return f"cannot start {server.command!r}: {getattr(e, 'strerror', None) or e}"
        connection = Connection(server, process)
        try:
            connection.start(timeout)
            listed = connection.list_tools(timeout)
        except ServerError as e:
            if server.url:
                return f"at {server.url} {e}"
            if server.in_sandbox and "exited with code" in str(e):  # most often: it is not where samples run
                return f'{e}; it runs in each sample\'s sandbox: is its command there? (else "shared": true)'
            return str(e)
        finally:
            connection.close()
    try:
        return schemas.offered_tools(server, listed)
    except schemas.ToolListError as e:
        return f"has a tool list that cannot be offered: {e}"
