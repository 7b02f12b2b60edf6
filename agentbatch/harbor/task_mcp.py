"""A task's own MCP servers ([environment] mcp_servers), offered to its agent as the run's own MCP servers are.

Harbor hands them to its agent, whose MCP client runs in the task's environment: a stdio server's command runs
in main, and a URL (`http://mcp-server:8000/mcp`) means what it means there. Here the runner is the client: a
stdio server runs in the sample's main container as the agent's user (mcp/servers.py, `in_sandbox`), and a URL is
reached at the address its host has in the sample's own network, localhost being main (`in_sample`), over
Streamable HTTP or SSE (Harbor's default). As the run's servers are, each is listed once per session before any
sample (the format's `ready` step): the task's environment is made as a sample's is, its healthcheck passed, each
server asked for its tools, and all of it removed. Its tools go into the run's tool set under the server's name,
and each of the task's samples gets them, connected to its own servers. A server that cannot be listed fails the
task's samples at once, with why; nothing has been spent.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

from agentbatch.harbor import container
from agentbatch.harbor.task_fields import McpServer
from agentbatch.mcp import loop, schemas, servers
from agentbatch.mcp.config import ServerConfig
from agentbatch.mcp.connection import Connection, ServerError
from agentbatch.mcp.tools import as_tool
from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import SandboxError, SandboxSpec
from agentbatch.sandboxes.process import stop_lasting_thread

LIST_TIMEOUT = 120.0
__all__ = ["Listed", "SandboxError", "ServerError", "clash", "done_listing", "list_tools", "sample_tools", "spec_for"]


@dataclass(frozen=True)
class Listed:
    """One of a task's servers, as its samples reach it, and the tools it listed at start."""

    server: ServerConfig
    tools: tuple[schemas.McpTool, ...]


def server_config(server: McpServer) -> ServerConfig:
    """A task's server as the MCP client takes it: a command in the sample's sandbox, or a URL of its network."""
    if server.transport == "stdio":
        return ServerConfig(name=server.name, command=server.command, args=server.args)
    return ServerConfig(name=server.name, url=server.url, sse=server.transport == "sse", in_sample=True)


def list_tools(spec: SandboxSpec, task, timeout: float = LIST_TIMEOUT) -> tuple[Listed, ...]:
    """Every server of the task listed in an environment made like its samples' (`spec`); SandboxError or
    ServerError saying which server failed and why."""
    backend = registry.get(spec.kind)
    backend.prepare(spec)
    box = backend.create(spec)
    try:
        if task.config.environment.healthcheck is not None:
            container.healthcheck(box, task.config.environment.healthcheck)
        return tuple(_one(box, server_config(s), timeout) for s in task.config.environment.mcp_servers)
    finally:
        backend.cleanup(box, False)


def _one(box, server: ServerConfig, timeout: float) -> Listed:
    with contextlib.ExitStack() as stack:
        if server.url:
            connection = Connection(servers.reached(box, server))
        else:
            connection = Connection(server, servers.start_in_sandbox(box, server))
        stack.callback(connection.close)
        try:
            connection.start(timeout)
            listed = connection.list_tools(timeout)
            return Listed(server, schemas.offered_tools(server, listed))
        except (ServerError, schemas.ToolListError) as e:
            raise ServerError(f"MCP server {server.name!r} {e}") from None


def done_listing() -> None:
    """The runner is one thread again before it forks its workers (as after the run's own servers' listing)."""
    loop.stop()
    stop_lasting_thread()


def sample_tools(listed: tuple[Listed, ...]) -> list:
    """The tools of a sample, each call sent to this sample's own server (started or reached at its first call)."""
    return [as_tool(item.server, tool) for item in listed for tool in item.tools]


def clash(listed: tuple[Listed, ...], taken: frozenset[str]) -> str | None:
    """Why these tools cannot join the run's (a name the run already has), or None."""
    for item in listed:
        if item.server.name in taken:
            return f"MCP server {item.server.name!r} has the name of one of the run's toolsets"
        for tool in item.tools:
            if tool.name in taken:
                return f"MCP server {item.server.name!r} lists the tool {tool.name!r}, a name the run's tools have"
    return None


def spec_for(run_spec: SandboxSpec, entry) -> SandboxSpec:
    """A sandbox like the entry's samples' own."""
    return replace(run_spec, image=entry.image, cwd=entry.cwd, resources=entry.resources)
