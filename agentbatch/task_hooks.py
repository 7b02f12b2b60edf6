"""What a dataset format adds to its entries' samples beyond the row's own fields (docs/datasets.md, "Hooks").

An entry's `hooks` (a `TaskHooks`) travel with each of its samples to the worker that runs it (pickled: plain
data and methods). There `before_agent` runs in the sample's sandbox before the agent's first model call, `tools`
then adds the entry's own tools to the sampled ones, and `check` runs after its last one, in the same sandbox,
instead of the row's `verify` and `answers`; a rescore runs `before_replay` and `check` in a fresh sandbox holding
the sample's kept final state. A format's steps
in the runner (before any sample, at the session's end) are methods of the format itself (dataset_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbatch.sandboxes.base import Sandbox
    from agentbatch.tools.context import ToolContext
    from agentbatch.tools.registry import Tool
    from agentbatch.verification import CheckResult


@dataclass(frozen=True)
class HookContext:
    """What a task's hooks get of their sample: its tool context, the run's model, and the check's time limit."""

    tools: ToolContext  # the sample's: its sandbox, made at first use, its limits, its clean-ups (on_cleanup)
    model: str  # the run's --model (an oracle run copies its reference solution in)
    check_timeout: float  # seconds the check may take: the task's own, bounded by the run's flags

    def sandbox(self) -> Sandbox:
        """The sample's sandbox (the agent's), made now if need be; SandboxError if it cannot be."""
        return self.tools.sandbox()


class TaskHooks:
    """A dataset format's part in each sample of one of its entries; subclass it and override what the task needs.

    A SandboxError out of either fails the sample (the environment's fault, not the model's; --resume runs it
    again); so does one out of `before_agent` before any model call.
    """

    def before_agent(self, sample: HookContext) -> Any:
        """After the row's setup, before the agent's first model call; what it returns is given to `check`."""
        return None

    def tools(self, sample: HookContext, before: Any) -> list[Tool]:
        """After `before_agent`: tools of the entry's own, offered to the agent beside its sampled ones (their
        toolsets are ones the format's `ready` step named, so that the run's tool set holds them)."""
        return []

    def prompt(self, sample: HookContext, before: Any, prompt: str) -> str:
        """After `tools`: the prompt the agent gets, from the entry's own (what its environment offers the agent
        may be added to it, as Harbor's agent lists a task's skills); the sample's line records what was sent."""
        return prompt

    def check(self, sample: HookContext, before: Any) -> CheckResult | None:
        """After the agent's last turn, in the same sandbox: the sample's check (None: the row's own applies)."""
        return None

    def before_replay(self, sample: HookContext) -> Any:
        """--rescore: in a fresh sandbox, before the sample's kept final state is put into it; what it returns is
        given to `check`, which then runs there. By default `before_agent`; a format whose `before_agent` does more
        than `check` needs (copies files in for the agent) gives only what the check needs."""
        return self.before_agent(sample)
