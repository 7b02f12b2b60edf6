"""Every toolset and tool of the contract (SPEC §3), their schemas, and the per-prompt context tools run in."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox import Sandbox, SandboxSpec, create_sandbox

TOOLSETS: dict[str, tuple[str, ...]] = {
    "web": ("web_search", "web_extract"),
    "vision": ("vision_analyze",),
    "image_gen": ("image_generate",),
    "terminal": ("terminal",),
    "file": ("read_file", "write_file", "patch", "search_files"),
    "moa": ("mixture_of_agents",),
    "browser": (
        "browser_navigate",
        "browser_snapshot",
        "browser_click",
        "browser_type",
        "browser_scroll",
        "browser_back",
        "browser_press",
        "browser_close",
        "browser_get_images",
        "browser_vision",
    ),
}
ALL_TOOL_NAMES: tuple[str, ...] = tuple(t for tools in TOOLSETS.values() for t in tools)
TOOLSET_OF: dict[str, str] = {t: ts for ts, tools in TOOLSETS.items() for t in tools}

# Modules that register tools; one missing (its issue not landed) leaves its tools unavailable.
TOOL_MODULES = (
    "tools_terminal",
    "tools_file",
    "tools_web",
    "tools_vision",
    "tools_image",
    "tools_moa",
    "tools_browser",
)


@dataclass
class ToolSettings:
    """Run-wide settings the tools need (from flags); backend keys are read from the environment by each tool."""

    base_url: str = ""
    api_key: str = ""
    model: str = ""
    vision_model: str | None = None
    image_model: str | None = None
    image_base_url: str | None = None
    moa_models: tuple[str, ...] = ()
    moa_aggregator: str | None = None
    allow_private_urls: bool = False
    command_timeout: float = 60.0
    max_output_chars: int = 20_000
    request_timeout: float = 120.0


@dataclass
class Usage:
    """Token counts, summed over every model call a prompt makes (auxiliary ones included)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def add(self, usage: Any) -> None:
        """Add an OpenAI usage object or dict; missing counts are zero."""
        if usage is None:
            return
        get = usage.get if isinstance(usage, dict) else lambda k, d=0: getattr(usage, k, d)
        p, c = get("prompt_tokens", 0) or 0, get("completion_tokens", 0) or 0
        self.prompt_tokens += p
        self.completion_tokens += c
        self.total_tokens += get("total_tokens", 0) or (p + c)


class ToolContext:
    """What one prompt's tools share: its lazily created sandbox, settings, usage and cleanups."""

    def __init__(self, settings: ToolSettings, spec: SandboxSpec, usage: Usage | None = None):
        self.settings = settings
        self.spec = spec
        self.usage = usage or Usage()
        self.resources: dict[str, Any] = {}
        self._sandbox: Sandbox | None = None
        self._cleanups: list[Callable[[], None]] = []

    def sandbox(self) -> Sandbox:
        """The prompt's sandbox, created on first use."""
        if self._sandbox is None:
            self._sandbox = create_sandbox(self.spec)
        return self._sandbox

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        """Run fn when the prompt ends, whatever the outcome (latest registered runs first)."""
        self._cleanups.append(fn)

    def close(self) -> None:
        """Release everything the prompt made; never raises."""
        for fn in reversed(self._cleanups):
            try:
                fn()
            except Exception:
                pass
        self._cleanups.clear()
        if self._sandbox is not None:
            try:
                self._sandbox.cleanup()
            finally:
                self._sandbox = None


Handler = Callable[[dict, ToolContext], dict]


@dataclass(frozen=True)
class Tool:
    """One function tool: its schema, its handler, and a check saying why it cannot be offered (or None)."""

    name: str
    description: str
    parameters: dict
    handler: Handler
    unavailable: Callable[[ToolSettings], str | None] = field(default=lambda settings: None)

    @property
    def toolset(self) -> str:
        return TOOLSET_OF[self.name]

    def schema(self) -> dict:
        """The OpenAI function-tool schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


_REGISTRY: dict[str, Tool] = {}
_loaded = False


def register(tool: Tool) -> Tool:
    """Add a tool of §3 to the registry."""
    if tool.name not in TOOLSET_OF:
        raise ValueError(f"{tool.name} is not a tool of any toolset")
    _REGISTRY[tool.name] = tool
    return tool


def _not_built(name: str) -> Tool:
    def handler(args: dict, ctx: ToolContext) -> dict:
        return {"error": f"tool {name} is not available in this build"}

    return Tool(
        name=name,
        description=f"{name} (not available in this build)",
        parameters={"type": "object", "properties": {}},
        handler=handler,
        unavailable=lambda settings: f"{name} is not implemented in this build",
    )


def load_tools() -> dict[str, Tool]:
    """Import every tool module once; tools no module registered answer with an error."""
    global _loaded
    if not _loaded:
        for module in TOOL_MODULES:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name != module:
                    raise
        _loaded = True
    return {name: _REGISTRY.get(name) or _not_built(name) for name in ALL_TOOL_NAMES}


def offered_tools(toolsets: list[str], settings: ToolSettings) -> list[Tool]:
    """The tools of the sampled toolsets that can work with these settings."""
    tools = load_tools()
    return [tools[name] for ts in toolsets for name in TOOLSETS[ts] if tools[name].unavailable(settings) is None]


def unavailable_tools(settings: ToolSettings) -> dict[str, str]:
    """Tool name → why it is left out of the offered tools."""
    out = {}
    for name, tool in load_tools().items():
        reason = tool.unavailable(settings)
        if reason:
            out[name] = reason
    return out


def call_tool(tool: Tool, raw_arguments: str, ctx: ToolContext) -> tuple[str, bool]:
    """Run a tool on the model's JSON arguments; returns (result JSON string, success)."""
    try:
        args = json.loads(raw_arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except ValueError as e:
        return json.dumps({"error": f"invalid JSON arguments: {e}"}), False
    try:
        result = tool.handler(args, ctx)
    except Exception as e:  # the model's call broke the tool: it sees why and may try again
        result = {"error": f"{type(e).__name__}: {e}"}
    if isinstance(result, dict):  # cap inside the values so the result stays valid JSON
        limit = ctx.settings.max_output_chars
        result = {k: cap_output(v, limit) if isinstance(v, str) else v for k, v in result.items()}
    return json.dumps(result, ensure_ascii=False), is_success(result)


def is_success(result: Any) -> bool:
    """A result is a success unless it carries a non-empty error."""
    return not (isinstance(result, dict) and result.get("error"))


def cap_output(text: str, limit: int) -> str:
    """Keep the head and the tail of an over-long text, marking what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"
