"""The tool set a run was started with: every toolset and its tools, and where the run's own ones came from.

The built-in toolsets come first, in their table's order, then those of plug-ins and tool modules (in the
order they registered), then one per MCP server (in mcp.json's order). Every trajectory line of the run
has an entry for each of its tools in `tool_stats` and `tool_error_counts`; statistics, the merge's
unknown-tool filter and the exports use the same list. The run directory keeps it (`record`); a session
that resumes the run with another set says what changed and goes on with both (`union`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from toolset_distributions import TOOLSETS


@dataclass(frozen=True)
class ToolSet:
    """Toolset -> its tools, in order; `sources` says where each of the run's own toolsets came from.

    `mcp` is the run's MCP setup (servers and the tools each listed at start), None without --mcp_config;
    a worker registers its tools at its start (run_tools.install).
    """

    toolsets: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(TOOLSETS))
    sources: dict[str, str] = field(default_factory=dict)
    mcp: Any = field(default=None, compare=False)

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every tool of the run, toolset by toolset."""
        return tuple(name for tools in self.toolsets.values() for name in tools)

    def with_toolsets(self, added: dict[str, tuple[tuple[str, ...], str]]) -> ToolSet:
        """This set with these toolsets added (name -> its tools, where they come from): a dataset's entries' own."""
        toolsets, sources = dict(self.toolsets), dict(self.sources)
        for name, (tools, source) in added.items():
            toolsets[name] = (*toolsets.get(name, ()), *(t for t in tools if t not in toolsets.get(name, ())))
            sources.setdefault(name, source)
        return ToolSet(toolsets, sources, self.mcp)

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
