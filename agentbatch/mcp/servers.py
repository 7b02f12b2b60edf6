"""How a sample's call of an MCP tool reaches its server, in a worker.

- A stdio server that is not shared is started inside the sample's sandbox at the sample's first call
  of one of its tools, and ends with the sample (ToolContext's cleanups run before its sandbox goes).
  If it dies, that call fails, and so does every later call of it in that sample; the next sample starts
  its own.
- A shared stdio server runs once per worker on the host, and a URL server has one connection per
  worker; either is started (connected) at its first call, and again at the next call after it died.
- A URL of the sample's own network (`in_sample`: a task's server in its container, or in a service beside
  it) is reached at the address its host has there, with its own Host header, one connection per sample.

Every call waits at most the command timeout (`--command_timeout`), and never past the sample's deadline.
What the model sees is the server's result, or `{"error": ...}` saying why there is none.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from urllib.parse import urlsplit, urlunsplit

from agentbatch.mcp import host, schemas
from agentbatch.mcp.config import ServerConfig
from agentbatch.mcp.connection import Connection, ServerError
from agentbatch.sandboxes.base import Process, Sandbox, SandboxError
from agentbatch.tools.context import ToolContext

_RESOURCE = "mcp_connections"


class Shared:
    """This worker's connections to shared and URL servers, each started at its first call and after it died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._connections: dict[str, Connection] = {}

    def get(self, server: ServerConfig, timeout: float) -> Connection:
        with self._lock:
            lock = self._locks.setdefault(server.name, threading.Lock())
        with lock:  # one start per server, the other samples wait for it
            connection = self._connections.get(server.name)
            if connection is not None and connection.alive:
                return connection
            if connection is not None:
                connection.close()
            connection = Connection(server, host.start(server) if server.transport == "stdio" else None)
            try:
                connection.start(timeout)
            finally:
                self._connections[server.name] = connection
            return connection

    def close(self) -> None:
        """End every connection and the servers they started."""
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()


SHARED = Shared()


def call(ctx: ToolContext, server: ServerConfig, tool: schemas.McpTool, arguments: dict) -> dict:
    """The model's call of one MCP tool: the server's result as JSON, or {"error": why there is none}."""
    timeout = ctx.settings.command_timeout  # cut to the sample's time left
    try:
        if server.in_sandbox or server.in_sample:
            connection = _in_sample(ctx, server, timeout)
        else:
            connection = SHARED.get(server, timeout)
        reply = connection.call(tool.remote_name, arguments, ctx.settings.command_timeout)
    except ServerError as e:
        return {"error": f"MCP server {server.name!r} {e}"}
    except host.CommandNotFound as e:
        return {"error": f"MCP server {server.name!r} cannot start: {e}"}
    except OSError as e:
        return {"error": f"MCP server {server.name!r} cannot start: {e.strerror or e}"}
    except SandboxError as e:
        return {"error": f"MCP server {server.name!r} cannot start in the sandbox: {e}"}
    return schemas.result(reply)


def start_in_sandbox(sandbox: Sandbox, server: ServerConfig) -> Process:
    """The server's command started in a sandbox (in its working directory, or the config's `cwd`), with its `env`.

    Its env is its secrets: where the sandbox's commands could read a process it starts (Docker's, whose
    commands share one PID namespace as the image's user), it is started apart from them (`start_apart`).
    """
    assert server.command is not None
    argv = [server.command, *server.args]
    if server.cwd:
        argv = ["/bin/sh", "-c", 'cd "$0" && exec "$@"', server.cwd, *argv]
    apart = getattr(sandbox, "start_apart", None)
    if server.env and apart is not None:
        return apart(argv, env=dict(server.env))
    return sandbox.start(argv, env=dict(server.env))


def reached(sandbox: Sandbox, server: ServerConfig) -> ServerConfig:
    """A URL of the sample's own network as the runner reaches it: its host's address there (localhost is the
    sandbox itself), the Host header kept; SandboxError if the sandbox has no address for it."""
    assert server.url is not None
    parts = urlsplit(server.url)
    address_of = getattr(sandbox, "address_of", None)
    address = address_of(parts.hostname or "") if address_of is not None else None
    if address is None:
        raise SandboxError(f"{parts.hostname!r} has no address in the sample's network")
    host = f"[{address}]" if ":" in address else address
    netloc = host + (f":{parts.port}" if parts.port else "")
    headers = {"Host": parts.netloc, **server.headers}
    return replace(server, url=urlunsplit(parts._replace(netloc=netloc)), headers=headers)


def _in_sample(ctx: ToolContext, server: ServerConfig, timeout: float) -> Connection:
    """The sample's own connection to the server, started in its sandbox (or reached in its network) at the first
    call."""
    connections: dict[str, Connection] | None = ctx.resources.get(_RESOURCE)
    if connections is None:
        connections = ctx.resources[_RESOURCE] = {}
        ctx.on_cleanup(lambda: [c.close() for c in connections.values()])
    connection = connections.get(server.name)
    if connection is None:
        if server.url:
            connection = connections[server.name] = Connection(reached(ctx.sandbox(), server))
        else:
            connection = connections[server.name] = Connection(server, start_in_sandbox(ctx.sandbox(), server))
        connection.start(timeout)
    return connection
