"""What a session hands its workers and gets back: the run's settings, a sample to run, how it ended.

Plain data, so the session, the executors and the workers share it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from agentbatch.limits import PromptLimits, TaskLimits
from agentbatch.model.client import ModelSettings
from agentbatch.model.usage import Prices
from agentbatch.sandboxes.base import Resources, SandboxSettings
from agentbatch.task_hooks import TaskHooks
from agentbatch.tool_set import ToolSet
from agentbatch.tools.settings import ToolSettings


@dataclass(frozen=True)
class RunConfig:
    """Everything a worker needs to run samples; built once by the parent from the settings (runtime.run_config)."""

    run_name: str
    model: ModelSettings
    tools: ToolSettings = field(default_factory=ToolSettings)
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)
    max_turns: int = 10
    limits: PromptLimits = field(default_factory=PromptLimits)
    prices: Prices = field(default_factory=Prices)
    system_prompt: str | None = None
    prefill: list[dict] = field(default_factory=list)
    require_reasoning: bool = True
    require_pass: bool = False
    check_timeout: float = 300.0
    verbose: bool = False
    log_prefix_chars: int = 100
    # Every credential of the run: redacted from tool results before the endpoint sees them, and from logs.
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # The plug-in modules and files the run named (--plugins, --tools): every worker loads them at its start.
    plugins: tuple[str, ...] = ()
    # The run's toolsets and tools (the built-ins and its own; tool_set.py): each line's tool_stats has an
    # entry for every tool of it, and a worker registers its MCP tools at its start (run_tools.install).
    tool_set: ToolSet = field(default_factory=ToolSet)
    # Which run directory and session the samples' sandboxes belong to (container labels, see session.py).
    sandbox_labels: dict[str, str] = field(default_factory=dict)
    # --keep_final_state: each sample's sandbox as its agent left it (sample_state.py), staged by the worker in
    # final_state_dir (outside the run directory) for the session to record.
    keep_final_state: bool = False
    final_state_dir: str | None = None


@dataclass
class SampleTask:
    """A sample to run: its prompt's dataset position, its sample number, batch, toolsets, sandbox and check."""

    index: int
    prompt: str
    batch_num: int
    toolsets: list[str]
    image: str | None = None
    cwd: str | None = None
    sample_index: int = 0
    setup: str | None = None
    verify: str | None = None
    answers: tuple[str, ...] = ()
    identity: str = ""  # the row's (dataset.task_identity), on every line the sample writes
    metadata: dict | None = None  # the task's name, difficulty, category, tags and image: the line's `task`
    resources: Resources | None = None  # its sandbox's own, over the run's flags (dataset.Entry)
    limits: TaskLimits = TaskLimits()  # its own, bounded by the run's flags; None: the flag
    hooks: TaskHooks | None = None  # its format's part before the agent and in the check (task_hooks.py)
    unavailable: str | None = None  # why it cannot run: it fails before any model call
    model: ModelSettings | None = None  # its own model (a Python caller's Rollouts.update); None: the run's

    @property
    def key(self) -> tuple[int, int]:
        """What tells this sample from the others in flight: (prompt index, sample index)."""
        return self.index, self.sample_index


@dataclass(frozen=True)
class Cancel:
    """Sent to a worker: the samples of these keys end at their next model call or tool (or never start)."""

    keys: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class HandedOut:
    """Sent to a worker: every task of the run is handed out, so the samples it holds are its last."""


@dataclass
class SampleOutcome:
    """How a sample ended: "done" with a record, "discarded" with a record and reason, or "failed" with an error."""

    index: int
    prompt: str
    batch_num: int
    status: str
    record: dict | None = None
    error: str | None = None
    usage: dict = field(default_factory=dict)
    seconds: float = 0.0
    sample_index: int = 0
    # Its kept final state (--keep_final_state): the staged file's path, or its bytes from a worker without the
    # staging directory (a Ray node elsewhere); the session records it beside the line, or removes it.
    final_state: str | bytes | None = None
    # The files its check kept (CheckResult.files): the runner writes them into the run directory (run_dir/artifacts.py).
    files: list[tuple[str, bytes]] = field(default_factory=list, repr=False)

    @property
    def key(self) -> tuple[int, int]:
        return self.index, self.sample_index


def now_iso() -> str:
    """The time of every line and file of a run: naive UTC, to the second."""
    return datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")
