"""The tool set a run was started with: every toolset and its tools, and where the run's own ones came from.

The built-in toolsets come first, in their table's order, then those of plug-ins and tool modules (in the
order they registered), then one per MCP server (in mcp.json's order). Every trajectory line of the run
has an entry for each of its tools in `tool_stats` and `tool_error_counts`; statistics, the merge's
unknown-tool filter and the exports use the same list. The run directory keeps it (`record`); a session
that resumes the run with another set says what changed and goes on with both (`union`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from agentbatch import plugins
from agentbatch.errors import FatalError
from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.secrets_guard import Redactor
from agentbatch.tools import registry
from toolset_distributions import (
    TOOLSETS,
    Distribution,
    DistributionError,
    check_toolsets,
    format_distributions,
    get_distribution,
    with_file,
)


@dataclass(frozen=True)
class ToolSet:
    """Toolset -> its tools, in order; `sources` says where each of the run's own toolsets came from.

    `mcp` is the run's MCP setup (servers and the tools each listed at start), None without --mcp_config.
    """

    toolsets: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(TOOLSETS))
    sources: dict[str, str] = field(default_factory=dict)
    mcp: Any = field(default=None, compare=False)

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every tool of the run, toolset by toolset."""
        return tuple(name for tools in self.toolsets.values() for name in tools)

    def install(self) -> None:
        """Register the run's MCP tools in this process (a worker's start; plug-in modules are plugins.load's)."""
        if self.mcp is not None:
            from agentbatch.mcp import tools

            tools.install(self.mcp)

    def secrets(self) -> tuple[str, ...]:
        """The MCP servers' `env` and `headers` values: redacted from every output like the API keys."""
        return self.mcp.secrets() if self.mcp is not None else ()

    def own(self) -> dict[str, tuple[str, ...]]:
        """The toolsets beyond the built-ins."""
        return {ts: tools for ts, tools in self.toolsets.items() if ts not in TOOLSETS}

    def record(self) -> dict:
        """What the run directory keeps of it (tools.json): no command's environment, no header."""
        return {"toolsets": {ts: list(tools) for ts, tools in self.toolsets.items()}, "sources": dict(self.sources)}

    @classmethod
    def from_record(cls, data: Any) -> ToolSet | None:
        """The set a run directory recorded; None when the record is not one (a run from before this file)."""
        if not isinstance(data, dict) or not isinstance(data.get("toolsets"), dict):
            return None
        toolsets = {}
        for ts, tools in data["toolsets"].items():
            if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
                return None
            toolsets[str(ts)] = tuple(tools)
        sources = data.get("sources")
        return cls(toolsets, {str(k): str(v) for k, v in sources.items()} if isinstance(sources, dict) else {})

    def changes(self, recorded: ToolSet) -> list[str]:
        """How this set differs from the one the run recorded, one phrase per toolset ([] if it does not)."""
        out = []
        for ts, tools in self.toolsets.items():
            before = recorded.toolsets.get(ts)
            if before is None:
                out.append(f"added toolset {ts} ({', '.join(tools)})")
            elif tuple(before) != tuple(tools):
                gained = [t for t in tools if t not in before]
                lost = [t for t in before if t not in tools]
                parts = ([f"+{', +'.join(gained)}"] if gained else []) + ([f"-{', -'.join(lost)}"] if lost else [])
                out.append(f"toolset {ts} changed ({'; '.join(parts) or 'order'})")
        out += [f"removed toolset {ts}" for ts in recorded.toolsets if ts not in self.toolsets]
        return out

    def union(self, recorded: ToolSet) -> ToolSet:
        """The recorded set with this one's toolsets and tools added: what the run's lines have entries for."""
        toolsets = {ts: tuple(tools) for ts, tools in recorded.toolsets.items()}
        for ts, tools in self.toolsets.items():
            toolsets[ts] = (*toolsets.get(ts, ()), *(t for t in tools if t not in toolsets.get(ts, ())))
        return ToolSet(toolsets, {**recorded.sources, **self.sources}, self.mcp)


def prepare(
    tool_modules: tuple[str, ...],
    mcp_config: str | None,
    distributions_file: str | None,
    distribution: str,
    timeout: float,
    getenv: Callable[[str], str | None],
    sandbox: SandboxSpec | None = None,
) -> tuple[ToolSet, Distribution]:
    """The run's tool set and distribution from its flags, before any model call; FatalError naming the problem.

    In order, so that what is quick to check fails first: each --tools module is loaded (through the plug-in
    loader, so the workers load it too) and must declare a tool; --mcp_config is read (a server's name is
    its toolset's); the distribution is chosen and every distribution checked against those toolsets; then
    each MCP server is started as its samples will start it (in a sandbox like `sandbox`, unless shared) and
    asked for its tools, which are registered in this process (a worker registers them from
    RunConfig.tool_set at its start).
    """
    toolsets, sources = _modules(tool_modules)
    servers: tuple = ()
    if mcp_config:
        config = _mcp_package().config
        servers = config.load(mcp_config, getenv)
        for s in servers:
            if s.name in toolsets:
                owner = "a built-in toolset" if s.name in TOOLSETS else f"the toolset of {sources[s.name]}"
                raise FatalError(f"--mcp_config {mcp_config}: server {s.name!r}: its name is {owner}; rename it")
            sources[s.name] = f"--mcp_config {mcp_config}: {s.describe()}"
    dist = _distribution(distributions_file, distribution, [*toolsets, *(s.name for s in servers)])
    setup = None
    if servers:
        setup = _listed(mcp_config, servers, timeout, sandbox)
        toolsets.update(setup.toolsets())
    return ToolSet(toolsets, sources, setup), dist


def distribution_table(tool_modules: tuple[str, ...], mcp_config: str | None, distributions_file: str | None) -> str:
    """The --list_distributions text: the built-ins and the file's, checked against the run's toolsets."""
    toolsets, _ = _modules(tool_modules)
    if mcp_config:
        toolsets.update((s.name, ()) for s in _mcp_package().config.load(mcp_config))
    try:
        table = with_file(distributions_file)
        check_toolsets(table, toolsets)
    except DistributionError as e:
        raise FatalError(str(e)) from None
    return format_distributions(table)


def _modules(tool_modules: tuple[str, ...]) -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """Every toolset so far (built-ins, installed plug-ins, --plugins, --tools) and where the run's own came from."""
    sources: dict[str, str] = {}
    for spec, module in zip(tool_modules, plugins.load(tool_modules), strict=True):
        declared = {t.toolset for t in registry.load_tools().values() if t.function.__module__ == module.__name__}
        if not declared:
            raise FatalError(f"--tools {spec} declares no tool (a function decorated with @tool); see docs/tools.md")
        sources.update((ts, f"--tools {spec}") for ts in declared)
    for t in registry.load_tools().values():  # installed plug-ins and --plugins modules
        if t.toolset not in TOOLSETS and t.toolset not in sources:
            sources[t.toolset] = f"plug-in {t.function.__module__}"
    return registry.toolsets(), sources


def _mcp_package():
    try:
        import agentbatch.mcp.config
        import agentbatch.mcp.listing
        import agentbatch.mcp.tools
    except ImportError as e:
        raise FatalError(f"--mcp_config needs the MCP SDK ({e}): pip install 'batch-runner[mcp]'") from None
    return agentbatch.mcp


def _distribution(path: str | None, name: str, toolsets: list[str]) -> Distribution:
    try:
        table = with_file(path)
        check_toolsets(table, toolsets)
        return get_distribution(name, table)
    except DistributionError as e:
        raise FatalError(str(e)) from None


def _listed(path: str, servers: tuple, timeout: float, sandbox: SandboxSpec | None):
    """The servers' tools, listed and registered here; what a failure says is redacted of their env and headers."""
    mcp = _mcp_package()
    redact = Redactor(v for s in servers for v in s.secrets())
    try:
        starter = mcp.listing.in_sandboxes(sandbox) if sandbox is not None else mcp.listing.on_host
        listed = mcp.listing.list_tools(servers, timeout, starter)
        setup = mcp.tools.McpSetup(servers, listed)
        mcp.tools.install(setup)
    except FatalError as e:
        raise FatalError(redact(str(e))) from None
    except registry.ToolDeclarationError as e:
        raise FatalError(redact(f"--mcp_config {path}: {e}")) from None
    return setup
