"""One prompt, start to finish, in a worker: sandbox check, agent loop, trajectory, quality filter."""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent_loop import run_agent
from model_client import ModelCallError, ModelClient, ModelSettings
from reasoning import has_think_block
from sandbox import SandboxError, SandboxSpec, prepare_sandbox
from tool_registry import ToolContext, ToolSettings, Usage, offered_tools
from trajectory import build_record


@dataclass
class RunConfig:
    """Everything a worker needs to run prompts; built once by the parent from the flags."""

    run_name: str
    model: ModelSettings
    tools: ToolSettings
    max_turns: int = 10
    system_prompt: str | None = None
    prefill: list[dict] = field(default_factory=list)
    require_reasoning: bool = True
    sandbox_kind: str = "local"
    docker_image: str | None = None
    docker_memory: str = "1g"
    docker_cpus: float = 1.0
    docker_pids: int = 256
    verbose: bool = False
    log_prefix_chars: int = 100
    # Credential-like variables withdrawn from the runner's environment (tool keys), for the tools' getenv.
    environment: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass
class PromptTask:
    """A prompt to run: its dataset position, batch, sampled toolsets and sandbox wishes."""

    index: int
    prompt: str
    batch_num: int
    toolsets: list[str]
    image: str | None = None
    cwd: str | None = None


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


_clients: dict[int, ModelClient] = {}
_clients_lock = threading.Lock()


def _client(cfg: RunConfig) -> ModelClient:
    # One client per config per process: its connection pool is shared by the worker's threads.
    with _clients_lock:
        client = _clients.get(id(cfg))
        if client is None:
            client = _clients[id(cfg)] = ModelClient(cfg.model)
        return client


def now_iso() -> str:
    return datetime.now(UTC).replace(tzinfo=None).isoformat(timespec="seconds")


def sandbox_spec(cfg: RunConfig, task: PromptTask) -> SandboxSpec:
    return SandboxSpec(
        kind=cfg.sandbox_kind,
        image=task.image or (cfg.docker_image if cfg.sandbox_kind == "docker" else None),
        cwd=task.cwd,
        run_name=cfg.run_name,
        memory=cfg.docker_memory,
        cpus=cfg.docker_cpus,
        pids=cfg.docker_pids,
    )


class _PromptContext(ToolContext):
    """Remembers why the sandbox could not be made, so the prompt fails instead of saving a trajectory of it."""

    sandbox_error: SandboxError | None = None

    def sandbox(self):
        try:
            return super().sandbox()
        except SandboxError as e:  # the environment's fault, not the model's: retried on resume
            self.sandbox_error = self.sandbox_error or e
            raise


def run_prompt(task: PromptTask, cfg: RunConfig) -> PromptOutcome:
    """Run one prompt; never raises: every problem becomes a failed outcome with its reason."""
    start = time.monotonic()
    usage = Usage()
    outcome = PromptOutcome(task.index, task.prompt, task.batch_num, "failed")
    ctx = None
    try:
        spec = sandbox_spec(cfg, task)
        prepare_sandbox(spec)  # before any model call: an unavailable image costs no tokens
        ctx = _PromptContext(cfg.tools, spec, usage)
        tools = offered_tools(task.toolsets, cfg.tools)
        result = run_agent(task.prompt, _client(cfg), tools, ctx, cfg.max_turns, cfg.system_prompt, cfg.prefill)
        if ctx.sandbox_error is not None:
            raise ctx.sandbox_error
        record = build_record(
            prompt_index=task.index,
            messages=result.messages,
            batch_num=task.batch_num,
            timestamp=now_iso(),
            model=cfg.model.model,
            completed=result.completed,
            partial=result.partial,
            api_calls=result.api_calls,
            toolsets=task.toolsets,
            usage=vars(usage),
            tool_schemas=result.tool_schemas,
        )
        outcome.record = record
        if cfg.require_reasoning and not any(
            has_think_block(t["value"]) for t in record["conversations"] if t["from"] == "gpt"
        ):
            outcome.status, outcome.error = "discarded", "no_reasoning"
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
        outcome.usage = vars(usage).copy()
        outcome.seconds = time.monotonic() - start
    return outcome
