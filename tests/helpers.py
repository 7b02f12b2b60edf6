"""Shared test helpers: run one prompt through the real prompt runner against a scripted server."""

from __future__ import annotations

import copy
import threading
from collections import Counter

from scripted_server import MODEL_ID, ScriptedServer

from agentbatch.model.client import ModelSettings
from agentbatch.sample_runner import Clients, run_sample
from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec
from agentbatch.tools.context import ToolContext
from agentbatch.tools.settings import ToolSettings
from agentbatch.work import RunConfig, SampleOutcome, SampleTask

API_KEY = "sk-test-0000"


def model_settings(server: ScriptedServer | None = None, **cfg) -> ModelSettings:
    """ModelSettings aimed at the server, with test-sized timeouts and retry delays (cfg overrides)."""
    values = {
        "model": MODEL_ID,
        "base_url": server.base_url if server else "http://127.0.0.1:9/v1",
        "api_key": API_KEY,
        "request_timeout": 10.0,
        "max_retries": 3,
        "retry_base_delay": 0.01,
    }
    values.update(cfg)
    return ModelSettings(**values)


def make_ctx(
    settings: ToolSettings | None = None,
    spec: SandboxSpec | None = None,
    server: ScriptedServer | None = None,
    **model,
) -> ToolContext:
    """A tool context as a prompt's tools get it (its model clients aimed at `server`, or at `base_url`)."""
    cfg = RunConfig(run_name="test", model=model_settings(server, **model), tools=settings or ToolSettings())
    clients = Clients.for_config(cfg)
    return ToolContext(cfg.tools, spec or SandboxSpec(), clients.chat, image_client=clients.images)


def run_prompt_outcome(
    server: ScriptedServer,
    prompt: str,
    toolsets: list[str],
    *,
    max_turns: int = 10,
    system_prompt: str | None = None,
    prefill: list[dict] | None = None,
    tool_settings: ToolSettings | None = None,
    cwd: str | None = None,
    prompt_index: int = 0,
    clients: Clients | None = None,
    require_reasoning: bool = False,
    sandbox: SandboxSettings | None = None,
    **model,
) -> SampleOutcome:
    """One prompt through the real prompt runner (sandbox, agent loop, trajectory), in a local sandbox by default.

    Pass `clients` to reuse them across many prompts (a new client costs ~25 ms loading CA certificates).
    """
    cfg = RunConfig(
        run_name="test",
        model=clients.chat.settings if clients else model_settings(server, **model),
        tools=tool_settings or ToolSettings(command_timeout=10.0),
        max_turns=max_turns,
        system_prompt=system_prompt,
        prefill=prefill or [],
        require_reasoning=require_reasoning,
        verbose=True,
        sandbox=sandbox or SandboxSettings(),
    )
    task = SampleTask(prompt_index, prompt, 1, list(toolsets), cwd=cwd)
    return run_sample(task, cfg, clients or Clients.for_config(cfg))


def run_agent_once(server: ScriptedServer, prompt: str, toolsets: list[str], **cfg) -> dict:
    """The trajectory record of one prompt run through the real prompt runner; fails if the prompt failed."""
    outcome = run_prompt_outcome(server, prompt, toolsets, **cfg)
    assert outcome.record is not None, f"the prompt failed: {outcome.error}"
    return outcome.record


def tool_turns(record: dict) -> list[dict]:
    return [t for t in record["conversations"] if t["from"] == "tool"]


def gpt_turns(record: dict) -> list[dict]:
    return [t for t in record["conversations"] if t["from"] == "gpt"]


class SequencedServer(ScriptedServer):
    """A ScriptedServer whose reply spec may carry "then": replies for later requests of the same turn.

    The scripted server picks replies by turn alone, so a dropped and re-asked reply would always come
    back the same; this lets a test script "a bad reply, then a good one" for one turn.
    """

    def __init__(self, *args, **kwargs):
        self._asked: Counter = Counter()
        self._asked_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _spec_for(self, prompt: str, turn: int) -> dict:
        spec = super()._spec_for(prompt, turn)
        later = spec.pop("then", None)
        with self._asked_lock:
            n = self._asked[(prompt, turn)]
            self._asked[(prompt, turn)] += 1
        if later and n > 0:
            return copy.deepcopy(later[min(n - 1, len(later) - 1)])
        return spec
