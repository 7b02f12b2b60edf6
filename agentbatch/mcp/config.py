"""--mcp_config: the mcp.json other MCP clients read, checked at start into one ServerConfig per server.

The shape is the usual `{"mcpServers": {"<name>": {...}}}`: a stdio server has `command` (and `args`,
`env`, `cwd`), a Streamable HTTP server has `url` (and `headers`), an SSE one `"type": "sse"` too. The runner's own keys are `shared`
(a stdio server runs once per worker on the host instead of inside each sample's sandbox), `prefix`
(put before each tool's name) and `tools` (offer only these). `${VAR}` in `args`, `env`, `cwd`, `url`
and `headers` is the runner's environment variable VAR (`${VAR:-default}` when it may be unset).
Every problem is one line naming the server and the key (docs/tools.md, "MCP servers").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentbatch.errors import FatalError

# A server's name is its toolset's name: the letters a distribution file and --export_toolsets can spell.
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Keys other clients write that mean nothing here (Cline, Cursor, Claude Desktop): accepted, ignored.
IGNORED_KEYS = frozenset({"autoApprove", "alwaysAllow", "description", "disabled", "timeout", "transportType"})
STDIO_KEYS = frozenset({"type", "command", "args", "env", "cwd", "shared", "prefix", "tools"})
HTTP_KEYS = frozenset({"type", "url", "headers", "prefix", "tools"})
HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamableHttp")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server as the config declares it: a command to run (stdio) or a URL (Streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    shared: bool = False
    prefix: str = ""
    tools: tuple[str, ...] | None = None
    sse: bool = False  # the URL speaks the older HTTP+SSE transport (Harbor's default for a task's servers)
    # A URL of the sample's own network (a task's server in its container or beside it): its host is looked up
    # there, and each sample has its own connection to its own server.
    in_sample: bool = False

    @property
    def transport(self) -> str:
        return ("sse" if self.sse else "http") if self.url else "stdio"

    @property
    def in_sandbox(self) -> bool:
        """A stdio server that is not shared runs inside each sample's sandbox and ends with it."""
        return self.transport == "stdio" and not self.shared

    def secrets(self) -> tuple[str, ...]:
        """What the runner redacts from every output: the values of `env` and `headers`."""
        return (*self.env.values(), *self.headers.values())

    def describe(self) -> str:
        """How --verbose and the run's recorded tool set name the server (no env or header values)."""
        if self.url:
            return f"{self.url} ({'SSE' if self.sse else 'Streamable HTTP'})"
        where = "shared, on the host" if self.shared else "in each sample's sandbox"
        return f"{' '.join((self.command or '', *self.args))} ({where})"


def load(path: str, getenv: Callable[[str], str | None] = os.environ.get) -> tuple[ServerConfig, ...]:
    """The servers of the mcp.json at `path`, in file order; FatalError naming the first problem."""
    where = f"--mcp_config {path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise FatalError(f"{where}: cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise FatalError(f"{where}: not JSON: {e}") from None
    return parse(data, where, getenv)


def parse(data: Any, where: str, getenv: Callable[[str], str | None] = os.environ.get) -> tuple[ServerConfig, ...]:
    """The servers of an mcp.json already decoded; FatalError naming the first problem."""
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise FatalError(f'{where}: expected {{"mcpServers": {{"<name>": {{"command": ...}} or {{"url": ...}}}}}}')
    servers = []
    for name, entry in data["mcpServers"].items():
        if not NAME.match(name):
            raise FatalError(
                f"{where}: server name {name!r}: use letters, digits, _ and - (it names the server's toolset)"
            )
        if not isinstance(entry, dict):
            raise FatalError(f"{where}: server {name!r}: expected an object with a command or a url")
        if entry.get("disabled") is True:
            continue
        servers.append(_server(name, entry, f"{where}: server {name!r}", getenv))
    if not servers:
        raise FatalError(f"{where}: no server in mcpServers")
    return tuple(servers)


def _server(name: str, entry: dict, where: str, getenv: Callable[[str], str | None]) -> ServerConfig:
    kind = entry.get("type")
    if kind is not None and kind not in ("stdio", "sse") and kind not in HTTP_TYPES:
        raise FatalError(f'{where}: type {kind!r}: use "stdio", "http" or "sse"')
    if kind == "sse" and "url" not in entry:
        raise FatalError(f"{where}: an SSE server needs a url")
    has_command, has_url = "command" in entry, "url" in entry
    if has_command == has_url:
        raise FatalError(f"{where}: give either a command (stdio) or a url (Streamable HTTP)")
    allowed = STDIO_KEYS if has_command else HTTP_KEYS
    unknown = [k for k in entry if k not in allowed and k not in IGNORED_KEYS]
    if unknown:
        raise FatalError(
            f"{where}: unknown key {unknown[0]!r}; a {'stdio' if has_command else 'url'} server takes "
            f"{', '.join(sorted(allowed))}"
        )
    expand = _expander(where, getenv)
    prefix = _string(entry, "prefix", where) or ""
    if prefix and not re.fullmatch(r"[A-Za-z0-9_-]*", prefix):
        raise FatalError(f"{where}: prefix {prefix!r}: use letters, digits, _ and -")
    tools = entry.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, str) and t for t in tools)):
        raise FatalError(f"{where}: tools must be a list of tool names")
    common = {"name": name, "prefix": prefix, "tools": tuple(tools) if tools is not None else None}
    if has_url:
        url = expand("url", _string(entry, "url", where))
        if not re.match(r"^https?://[^/\s]+", url or ""):
            raise FatalError(f"{where}: url {url!r}: expected an http:// or https:// address")
        return ServerConfig(url=url, headers=_mapping(entry, "headers", where, expand), sse=kind == "sse", **common)
    command = _string(entry, "command", where)
    if not command:
        raise FatalError(f"{where}: command is empty")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise FatalError(f"{where}: args must be a list of strings")
    shared = entry.get("shared", False)
    if not isinstance(shared, bool):
        raise FatalError(f"{where}: shared must be true or false")
    cwd = _string(entry, "cwd", where)
    return ServerConfig(
        command=expand("command", command),
        args=tuple(expand("args", a) for a in args),
        env=_mapping(entry, "env", where, expand),
        cwd=expand("cwd", cwd) if cwd else None,
        shared=shared,
        **common,
    )


def _string(entry: dict, key: str, where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, str):
        raise FatalError(f"{where}: {key} must be a string")
    return value


def _mapping(entry: dict, key: str, where: str, expand: Callable[[str, str], str]) -> dict[str, str]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise FatalError(f"{where}: {key} must be an object of strings")
    return {k: expand(key, v) for k, v in value.items()}


def _expander(where: str, getenv: Callable[[str], str | None]) -> Callable[[str, str], str]:
    def expand(key: str, text: str) -> str:
        def one(m: re.Match) -> str:
            value = getenv(m.group(1))
            if value is None:
                if m.group(2) is None:
                    raise FatalError(f"{where}: {key} names ${{{m.group(1)}}}, which is not set")
                return m.group(2)
            return value

        return _VARIABLE.sub(one, text)

    return expand
