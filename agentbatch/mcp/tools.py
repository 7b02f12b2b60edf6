"""The run's MCP setup (its servers and the tools each listed at start), and its tools in a process's registry.

The runner lists every server's tools once, at start (listing.py); the workers get the setup in their
RunConfig and register the same tools at their start, without asking the servers again. Each tool is a
registry Tool whose schema is the server's and whose function sends the model's arguments to it
(servers.call); its toolset is the server's name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from agentbatch.mcp import schemas, servers
from agentbatch.mcp.config import ServerConfig
from agentbatch.tools import registry
from agentbatch.tools.context import ToolContext


@dataclass(frozen=True)
class McpSetup:
    """The run's MCP servers, in mcp.json's order, and the tools each offers."""

    servers: tuple[ServerConfig, ...]
    tools: tuple[schemas.McpTool, ...]

    def toolsets(self) -> dict[str, tuple[str, ...]]:
        """Server name (its toolset) -> the names of its tools."""
        return {s.name: tuple(t.name for t in self.tools if t.server == s.name) for s in self.servers}

    def secrets(self) -> tuple[str, ...]:
        return tuple(v for s in self.servers for v in s.secrets())


_installed: set[int] = set()
_lock = threading.Lock()


def install(setup: McpSetup) -> None:
    """Register the setup's tools in this process's registry (once); ToolDeclarationError on a clash."""
    with _lock:
        if id(setup) in _installed:
            return
        by_name = {s.name: s for s in setup.servers}
        for t in setup.tools:
            registry.register(as_tool(by_name[t.server], t))
        _installed.add(id(setup))


def as_tool(server: ServerConfig, t: schemas.McpTool) -> registry.Tool:
    """One listed tool as a registry Tool: the server's schema, its toolset the server's name, calls sent to it."""
    return registry.Tool(
        name=t.name,
        description=t.description,
        params=(),
        function=_caller(server, t),
        unavailable=lambda settings: None,
        toolset=t.server,
        parameters=t.parameters,
        origin=f"MCP server {t.server!r}",
    )


def _caller(server: ServerConfig, tool: schemas.McpTool):
    def call(ctx: ToolContext, /, **arguments) -> dict:  # any argument name, "ctx" too, is the server's
        return servers.call(ctx, server, tool, arguments)

    call.__qualname__ = f"mcp.{server.name}.{tool.remote_name}"
    return call
