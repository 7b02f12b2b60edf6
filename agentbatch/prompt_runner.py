"""One sample of a prompt, start to finish, in a worker: sandbox, setup, agent loop, check, trajectory, filters."""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from agentbatch import sandboxes, verification
from agentbatch.agent_loop import run_agent
from agentbatch.limits import PromptLimits, SessionLimits
from agentbatch.model import registry as models
from agentbatch.model.base import Model, ModelCallError
from agentbatch.model.client import ModelClient, ModelSettings
from agentbatch.model.usage import Prices, Usage
from agentbatch.sandboxes.base import SandboxError, SandboxSettings, SandboxSpec
from agentbatch.secrets_guard import Redactor
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import offered_tools
from agentbatch.tools.settings import ToolSettings
from trajectory import build_record, has_think_block


@dataclass
class RunConfig:
    """Everything a worker needs to run prompts; built once by the parent from the flags."""

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
    # The plug-in modules and files the run named (--plugins): every worker loads them at its start.
    plugins: tuple[str, ...] = ()
    # Which run directory and session the prompts' sandboxes belong to (container labels, see session.py).
    sandbox_labels: dict[str, str] = field(default_factory=dict)


@dataclass
class PromptTask:
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

    @property
    def key(self) -> tuple[int, int]:
        """What tells this sample from the others in flight: (prompt index, sample index)."""
        return self.index, self.sample_index


@dataclass
class PromptOutcome:
    """How a prompt ended: "done" with a record, "discarded" with a record and reason, or "failed" with an error."""

    index: int
    prompt: str
    batch_num: int
    status: str
    record: dict | None = None
    error: str | None = None
    usage: dict = field(default_factory=dict)
    seconds: float = 0.0
    sample_index: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return self.index, self.sample_index


@dataclass
class Clients:
    """A worker's models, shared by its slots: the run's (model.registry), and the images endpoint's if another."""

    chat: Model
    images: Model

    @classmethod
    def for_config(cls, cfg: RunConfig) -> Clients:
        chat = models.make(cfg.model)
        t = cfg.tools
        if not (t.image_base_url or t.image_api_key):
            return cls(chat, chat)
        images = replace(
            cfg.model, base_url=t.image_base_url or cfg.model.base_url, api_key=t.image_api_key or cfg.model.api_key
        )
        return cls(chat, ModelClient(images))


# --require_pass: why a sample that did not pass was discarded, by its check's status.
DISCARD_REASONS = {"failed": "check_failed", "timeout": "check_timeout", "error": "check_error", "none": "no_check"}


def now_iso() -> str:
    return datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def run_prompt(task: PromptTask, cfg: RunConfig, clients: Clients) -> PromptOutcome:
    """Run one prompt; never raises: every problem becomes a failed outcome with its reason."""
    start = time.monotonic()
    usage = Usage(prices=cfg.prices)
    outcome = PromptOutcome(task.index, task.prompt, task.batch_num, "failed", sample_index=task.sample_index)
    ctx = None
    try:
        spec = SandboxSpec(
            cfg.sandbox, image=task.image, cwd=task.cwd, run_name=cfg.run_name, labels=dict(cfg.sandbox_labels)
        )
        sandboxes.prepare(spec)  # before any model call: an unavailable image costs no tokens
        limits = SessionLimits(cfg.limits, usage)  # the time limit counts from here, after the image check
        ctx = ToolContext(cfg.tools, spec, clients.chat, usage, clients.images, limits, redact=Redactor(cfg.secrets))
        if task.setup:  # before any model call too: a task whose files cannot be made costs no tokens
            verification.run_setup(ctx, task.setup, cfg.check_timeout)
        tools = offered_tools(task.toolsets, cfg.tools)
        result = run_agent(
            task.prompt, clients.chat, tools, ctx, cfg.max_turns, cfg.system_prompt, cfg.prefill, cfg.model.logprobs
        )
        if ctx.sandbox_error is not None:
            raise ctx.sandbox_error
        # In the same sandbox, before ctx.close() removes it.
        check = verification.run_check(
            ctx, task.verify, task.answers, verification.last_message(result.messages), cfg.check_timeout
        )
        record = build_record(
            prompt_index=task.index,
            messages=result.messages,
            batch_num=task.batch_num,
            timestamp=now_iso(),
            model=cfg.model.model,
            completed=result.completed,
            partial=result.partial,
            stop_reason=result.stop_reason,
            api_calls=result.api_calls,
            toolsets=task.toolsets,
            usage=usage.as_dict(),
            tool_schemas=result.tool_schemas,
            sample_index=task.sample_index,
            outcome=check.fields(),
        )
        outcome.record = record
        if cfg.require_reasoning and not any(
            has_think_block(t["value"]) for t in record["conversations"] if t["from"] == "gpt"
        ):
            outcome.status, outcome.error = "discarded", "no_reasoning"
        elif cfg.require_pass and not check.passed:
            outcome.status, outcome.error = "discarded", DISCARD_REASONS[check.status]
        else:
            outcome.status = "done"
    except (ModelCallError, SandboxError) as e:
        outcome.error = str(e)
    except Exception as e:  # a bug of ours fails this prompt, loudly, but never the run
        outcome.error = f"internal error: {type(e).__name__}: {e}"
        if cfg.verbose:
            outcome.error += "\n" + traceback.format_exc()
    finally:
        if ctx is not None:
            ctx.close()
        outcome.usage = usage.as_dict()
        outcome.seconds = time.monotonic() - start
    return outcome
