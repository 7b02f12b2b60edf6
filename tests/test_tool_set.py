"""The run's tool set: its names in order, its record in the run directory, and how a resumed run's differs."""

from __future__ import annotations

from agentbatch.tool_set import ToolSet
from toolset_distributions import ALL_TOOL_NAMES, TOOLSETS


def test_names_record_and_changes():
    started = ToolSet({**TOOLSETS, "orders": ("lookup", "cancel"), "time": ("now",)}, {"orders": "--tools o.py"})
    assert started.names == (*ALL_TOOL_NAMES, "lookup", "cancel", "now")
    assert started.own() == {"orders": ("lookup", "cancel"), "time": ("now",)}
    assert ToolSet.from_record(started.record()) == started
    assert ToolSet.from_record({"toolsets": {"a": "b"}}) is None and ToolSet.from_record([]) is None
    assert ToolSet().changes(ToolSet()) == []

    later = ToolSet({**TOOLSETS, "orders": ("lookup", "refund"), "git": ("status",)})
    assert later.changes(started) == [
        "toolset orders changed (+refund; -cancel)",
        "added toolset git (status)",
        "removed toolset time",
    ]
    both = later.union(started)
    assert both.names == (*ALL_TOOL_NAMES, "lookup", "cancel", "refund", "now", "status")
    assert both.sources == {"orders": "--tools o.py"}
