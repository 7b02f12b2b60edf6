"""The run's own tools from its flags, before any model call: --tools modules, --mcp_config servers, distributions.

What is quick to check fails first, with one line naming the problem: each --tools module is loaded (through
the plug-in loader, so the workers load it too) and must declare a tool; --mcp_config is read (a server's
name is its toolset's); the distribution is chosen and every distribution checked against those toolsets;
then each MCP server is started as its samples will start it and asked for its tools (mcp/listing.py).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

import agentbatch.plugins as plugins
from agentbatch.errors import FatalError
from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.secrets_guard import Redactor
from agentbatch.tool_set import ToolSet
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
    own = [ts for ts in toolsets if sources.get(ts, "").startswith("--tools ")] + [s.name for s in servers]
    dist = dataclasses.replace(dist, always=tuple(ts for ts in own if ts not in dist.names()))
    setup = None
    if servers:
        setup = _listed(mcp_config, servers, timeout, sandbox)
        toolsets.update(setup.toolsets())
    if own:
        print(offered_line(own, dist), file=sys.stderr)
    return ToolSet(toolsets, sources, setup), dist


def offered_line(own: list[str], dist: Distribution) -> str:
    """The start line saying how the run's own toolsets are offered: to every sample unless the distribution
    names them, then at its percent."""
    always = [ts for ts in own if ts in dist.always]
    parts = [f"{', '.join(always)} offered to every sample (the distribution does not name them)"] if always else []
    parts += [f"{ts} at {dist.probabilities[ts]}%" for ts in own if ts in dist.probabilities]
    parts += [f"{ts} never (0%)" for ts in own if ts in dist.excluded]
    return f"own toolsets, distribution {dist.name!r}: {'; '.join(parts)}"


def install(tool_set: ToolSet) -> None:
    """At a worker's start: register the run's MCP tools, as the runner listed them (plug-in modules are plugins.load's)."""
    if tool_set.mcp is not None:
        _mcp_package().tools.install(tool_set.mcp)


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
