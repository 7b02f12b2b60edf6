"""One sample of a prompt, start to finish, in a worker: sandbox, setup, agent loop, check, trajectory, filters."""

from __future__ import annotations

import secrets
import threading
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, replace

import agentbatch.sample_state as sample_state
import agentbatch.verification as verification
from agentbatch.agent_loop import run_agent
from agentbatch.limits import CANCELLED, SampleLimits
from agentbatch.model import cache
from agentbatch.model import registry as models
from agentbatch.model.base import Model, ModelCallError
from agentbatch.model.client import ModelClient
from agentbatch.model.usage import Usage
from agentbatch.sample_tokens import TokenRecorder
from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import SandboxError, SandboxSpec
from agentbatch.secrets_guard import Redactor
from agentbatch.task_hooks import HookContext
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import offered_tools
from agentbatch.work import RunConfig, SampleOutcome, SampleTask, now_iso
from trajectory import build_record, has_think_block


@dataclass
class Clients:
    """A worker's models, shared by its slots: the run's (model.registry), and the images endpoint's if another."""

    chat: Model
    images: Model

    @classmethod
    def for_config(cls, cfg: RunConfig) -> Clients:
        chat = models.make(cfg.model)
        images = cfg.tools.image_endpoint(cfg.model.base_url, cfg.model.api_key)
        if images is None:
            return cls(chat, chat)
        settings = replace(cfg.model, base_url=images[0], api_key=images[1])
        return cls(chat, cache.cached(ModelClient(settings), settings))

    def for_sample(self, task: SampleTask, usage: Usage) -> Clients:
        """The models as one sample calls them: its session headers on every HTTP call (client.session_headers), and
        a cached model keys its calls by the sample and counts its hits."""
        session_id = new_session_id()
        chat, images = (_in_session(m, session_id) for m in (self.chat, self.images))
        chat = cache.for_sample(chat, task.sample_index, usage)
        images = chat if self.images is self.chat else cache.for_sample(images, task.sample_index, usage)
        return Clients(chat, images)


def _in_session(model: Model, session_id: str) -> Model:
    """The model with one sample's session headers, where it is called over HTTP (a client, or a cache over one)."""
    for_session = getattr(model, "for_session", None)
    return for_session(session_id) if for_session is not None else model


def new_session_id() -> str:
    """One sample's session id: stable across its calls, another for every sample (and for every attempt)."""
    return f"br-{secrets.token_hex(8)}"


class WorkerClients:
    """A worker's Clients for each model its samples name: the run's, and the few a Python caller pointed the
    run at since (Rollouts.update: another model, endpoint or policy label), without restarting the worker."""

    KEPT = 4  # models besides the run's whose connections are kept

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.run_clients = Clients.for_config(cfg)
        self._others: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def run(self, task: SampleTask, cancelled: threading.Event | None = None) -> SampleOutcome:
        """Run the sample with the model it names (the run's when it names none)."""
        if task.model is None or task.model == self.cfg.model:
            return run_sample(task, self.cfg, self.run_clients, cancelled)
        cfg = replace(self.cfg, model=task.model)
        with self._lock:
            clients = self._others.pop(task.model, None) or Clients.for_config(cfg)
            self._others[task.model] = clients
            while len(self._others) > self.KEPT:
                self._others.popitem(last=False)
        return run_sample(task, cfg, clients, cancelled)


# --require_pass: why a sample that did not pass was discarded, by its check's status.
DISCARD_REASONS = {"failed": "check_failed", "timeout": "check_timeout", "error": "check_error", "none": "no_check"}


def sandbox_spec(task: SampleTask, cfg: RunConfig) -> SandboxSpec:
    """Where the sample runs: the run's sandbox settings, its row's image, cwd and resources, the run's labels."""
    return SandboxSpec(
        cfg.sandbox,
        image=task.image,
        cwd=task.cwd,
        run_name=cfg.run_name,
        labels=dict(cfg.sandbox_labels),
        resources=task.resources,
    )


def run_sample(
    task: SampleTask, cfg: RunConfig, clients: Clients, cancelled: threading.Event | None = None
) -> SampleOutcome:
    """Run one sample; never raises: every problem becomes a failed outcome with its reason. `cancelled`, once set,
    ends it at its next model call or tool (its sandbox removed as always), a failed outcome saying so."""
    start = time.monotonic()
    usage = Usage(prices=cfg.prices)
    outcome = SampleOutcome(task.index, task.prompt, task.batch_num, "failed", sample_index=task.sample_index)
    ctx = None
    clients = clients.for_sample(task, usage)
    recorder = TokenRecorder(cfg.model.tokenizer, cfg.model.policy_version) if cfg.model.token_ids else None
    try:
        spec = sandbox_spec(task, cfg)
        if task.unavailable:  # its image could not be made: it fails before any model call
            raise SandboxError(task.unavailable)
        if cancelled is not None and cancelled.is_set():
            raise ModelCallError(CANCELLED)
        sandbox_backends.get(spec.kind).prepare(spec)  # before any model call: an absent image costs no tokens
        seconds = task.limits.prompt_timeout if task.limits.prompt_timeout is not None else cfg.limits.seconds
        limits = SampleLimits(replace(cfg.limits, seconds=seconds), usage, cancelled=cancelled)  # from here
        ctx = ToolContext(cfg.tools, spec, clients.chat, usage, clients.images, limits, redact=Redactor(cfg.secrets))
        check_timeout = task.limits.check_timeout if task.limits.check_timeout is not None else cfg.check_timeout
        hooked = HookContext(ctx, cfg.model.model, check_timeout)
        if task.setup:  # before any model call too: a task whose files cannot be made costs no tokens
            verification.run_setup(ctx, task.setup, check_timeout)
        before = task.hooks.before_agent(hooked) if task.hooks is not None else None
        tools = offered_tools(task.toolsets, cfg.tools) + (task.hooks.tools(hooked, before) if task.hooks else [])
        prompt = task.hooks.prompt(hooked, before, task.prompt) if task.hooks is not None else task.prompt
        if tools:  # its commands may come: their sandbox starts while the model thinks, where that pays
            ctx.start_sandbox_early()
        prefill, logprobs = cfg.prefill, cfg.model.logprobs
        result = run_agent(
            prompt, clients.chat, tools, ctx, cfg.max_turns, cfg.system_prompt, prefill, logprobs, recorder
        )
        if ctx.sandbox_error is not None:
            raise ctx.sandbox_error
        if limits.cancelled.is_set():
            raise ModelCallError(CANCELLED)
        if cfg.keep_final_state:  # as the agent left it, before the check changes anything
            outcome.final_state = sample_state.keep(ctx, spec, cfg.final_state_dir)
        # In the same sandbox, before ctx.close() removes it.
        check = task.hooks.check(hooked, before) if task.hooks is not None else None
        if check is None:
            check = verification.run_check(
                ctx, task.verify, task.answers, verification.last_message(result.messages), check_timeout
            )
        record = _record(task, cfg, result, usage, check.fields(), time.monotonic() - start, recorder)
        outcome.record = record
        outcome.files = check.files
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
    except Exception as e:  # a bug of ours fails this sample, loudly, but never the run
        outcome.error = f"internal error: {type(e).__name__}: {e}"
        if cfg.verbose:
            outcome.error += "\n" + traceback.format_exc()
    finally:
        if ctx is not None:
            ctx.close(interrupted=outcome.status == "failed")
        outcome.usage = usage.as_dict()
        outcome.seconds = time.monotonic() - start
    return outcome


def _record(task: SampleTask, cfg: RunConfig, result, usage: Usage, outcome: dict, seconds: float, recorder) -> dict:
    """The sample's trajectory line (trajectory.build_record), its `tokens` with --token_ids."""
    return build_record(
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
        outcome=outcome,
        identity=task.identity,
        tool_names=cfg.tool_set.names,
        task=task.metadata,
        duration_seconds=seconds,
        token_ids=recorder is not None,
        tokens=recorder.tokens() if recorder is not None else None,
        policy_version=cfg.model.policy_version,
    )
