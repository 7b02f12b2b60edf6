"""Shared test helpers: run the real agent loop once against a scripted server, in a real local sandbox."""

from __future__ import annotations

import copy
import threading
from collections import Counter

from agent_loop import AgentResult, run_agent
from model_client import ModelClient, ModelSettings
from sandbox import SandboxSpec
from scripted_server import MODEL_ID, ScriptedServer
from tool_registry import ToolContext, ToolSettings, Usage, offered_tools
from trajectory import build_record

API_KEY = "sk-test-0000"


def model_settings(server: ScriptedServer, **cfg) -> ModelSettings:
    """ModelSettings aimed at the server, with test-sized timeouts and retry delays (cfg overrides)."""
    values = {
        "model": MODEL_ID,
        "base_url": server.base_url,
        "api_key": API_KEY,
        "request_timeout": 10.0,
        "max_retries": 3,
        "retry_base_delay": 0.01,
    }
    values.update(cfg)
    return ModelSettings(**values)


def run_agent_full(
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
    client: ModelClient | None = None,
    **cfg,
) -> tuple[dict, AgentResult]:
    """Run one prompt through ModelClient + run_agent + build_record; returns (record, loop result).

    Pass a client to reuse it across many prompts (a new one costs ~50 ms loading CA certificates).
    """
    settings = client.settings if client else model_settings(server, **cfg)
    tool_settings = tool_settings or ToolSettings(
        base_url=server.base_url, api_key=settings.api_key, model=settings.model, command_timeout=10.0
    )
    usage = Usage()
    ctx = ToolContext(tool_settings, SandboxSpec(kind="local", cwd=cwd), usage)
    try:
        tools = offered_tools(toolsets, tool_settings)
        result = run_agent(prompt, client or ModelClient(settings), tools, ctx, max_turns, system_prompt, prefill)
    finally:
        ctx.close()
    record = build_record(
        prompt_index=prompt_index,
        messages=result.messages,
        batch_num=1,
        timestamp="2026-01-01T00:00:00",
        model=settings.model,
        completed=result.completed,
        partial=result.partial,
        api_calls=result.api_calls,
        toolsets=toolsets,
        usage=vars(usage),
        tool_schemas=result.tool_schemas,
    )
    return record, result


def run_agent_once(server: ScriptedServer, prompt: str, toolsets: list[str], **cfg) -> dict:
    """The trajectory record of one prompt run through the real loop (see run_agent_full)."""
    return run_agent_full(server, prompt, toolsets, **cfg)[0]


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
