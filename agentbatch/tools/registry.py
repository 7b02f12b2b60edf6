"""How a tool is declared, offered and called.

A tool is a function decorated with `@tool`: its name is the tool's name, its docstring the description,
and its typed parameters (after the context) the JSON schema the model sees and the check its arguments
pass before the function runs. `Annotated[str, "text"]` gives a parameter its description; a parameter
with a default is optional. What the function returns (a dict) goes back to the model as JSON; a
non-empty "error" marks the call failed.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import threading
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from agentbatch.sandboxes.base import SandboxLost
from agentbatch.surrogates import scrub
from agentbatch.tools.context import ToolContext
from agentbatch.tools.settings import ToolSettings
from toolset_distributions import ALL_TOOL_NAMES, TOOLSET_OF, TOOLSETS

# The modules that declare tools, imported on first use (the browser's pulls in Playwright only when called).
TOOL_MODULES = ("terminal", "files", "web", "vision", "image", "moa", "browser")
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_EXPECTED = {
    "string": "a string",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list of strings",
}


class ArgumentError(ValueError):
    """The model's arguments do not fit the tool's declaration."""


@dataclass(frozen=True)
class Param:
    """One declared parameter: JSON type, description, and the default when optional."""

    name: str
    type: str
    description: str | None
    required: bool
    default: Any = None
    enum: tuple[str, ...] = ()

    def schema(self) -> dict:
        out: dict[str, Any] = {"type": self.type}
        if self.type == "array":
            out["items"] = {"type": "string"}
        if self.enum:
            out["enum"] = list(self.enum)
        if self.description:
            out["description"] = self.description
        return out


@dataclass(frozen=True)
class Tool:
    """A declared tool: its schema, its function, and a check saying why it cannot be offered (or None)."""

    name: str
    description: str
    params: tuple[Param, ...]
    function: Callable[..., dict]
    unavailable: Callable[[ToolSettings], str | None]
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def toolset(self) -> str:
        return TOOLSET_OF[self.name]

    def schema(self) -> dict:
        """The OpenAI function-tool schema: one dict per tool, made once (the model client encodes it once too)."""
        cached = _SCHEMAS.get(self.name)
        if cached is not None and cached[0] is self:
            return cached[1]
        schema = self._schema()
        _SCHEMAS[self.name] = (self, schema)
        return schema

    def _schema(self) -> dict:
        parameters: dict[str, Any] = {"type": "object", "properties": {p.name: p.schema() for p in self.params}}
        required = [p.name for p in self.params if p.required]
        if required:
            parameters["required"] = required
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def arguments(self, args: dict) -> dict:
        """The keyword arguments of the function, checked and converted; raises ArgumentError."""
        for alias, name in self.aliases:  # a name models often use instead of the declared one
            if args.get(name) is None and args.get(alias) is not None:
                args = dict(args, **{name: args[alias]})
        out = {}
        for p in self.params:
            value = args.get(p.name)
            if value is None:
                if p.required:
                    raise ArgumentError(f"{p.name} is required")
                out[p.name] = p.default
            else:
                out[p.name] = _convert(p, value)
        return out


_REGISTRY: dict[str, Tool] = {}
_SCHEMAS: dict[str, tuple[Tool, dict]] = {}
_LOADED: dict[str, Tool] = {}


def tool(
    unavailable: Callable[[ToolSettings], str | None] | None = None, aliases: dict[str, str] | None = None
) -> Callable[[Callable[..., dict]], Callable[..., dict]]:
    """Declare the decorated function as the tool of its name (one of the toolsets' tools)."""

    def declare(fn: Callable[..., dict]) -> Callable[..., dict]:
        if fn.__name__ not in TOOLSET_OF:
            raise ValueError(f"{fn.__name__} is not a tool of any toolset")
        _REGISTRY[fn.__name__] = Tool(
            name=fn.__name__,
            description=" ".join((fn.__doc__ or "").split()),
            params=_params(fn),
            function=fn,
            unavailable=unavailable or (lambda settings: None),
            aliases=tuple((aliases or {}).items()),
        )
        return fn

    return declare


def _params(fn: Callable) -> tuple[Param, ...]:
    hints = typing.get_type_hints(fn, include_extras=True)
    params = []
    for name, parameter in list(inspect.signature(fn).parameters.items())[1:]:  # the first is the context
        hint, description = hints[name], None
        if typing.get_origin(hint) is Annotated:
            hint, description = typing.get_args(hint)[0], typing.get_args(hint)[1]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))  # Optional: not required
        required = parameter.default is inspect.Parameter.empty
        default = None if required else parameter.default
        if typing.get_origin(hint) is typing.Literal:
            params.append(Param(name, "string", description, required, default, typing.get_args(hint)))
        else:
            params.append(
                Param(
                    name,
                    "array" if typing.get_origin(hint) is list else _JSON_TYPES[hint],
                    description,
                    required,
                    default,
                )
            )
    return tuple(params)


def _convert(p: Param, value: Any) -> Any:
    """The value as the declared type; what models commonly send for it (a number as text) is accepted."""
    if p.type == "string" and isinstance(value, str):
        return value
    if p.type == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    if p.type in ("integer", "number") and not isinstance(value, bool):
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if isinstance(number, (int, float)) and math.isfinite(number):
            if p.type == "number":
                return number
            if float(number).is_integer():
                return int(number)
    if p.type == "array":
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    shown = json.dumps(value, ensure_ascii=False)
    raise ArgumentError(f"{p.name} must be {_EXPECTED[p.type]}, got {shown[:60]}")


def load_tools() -> dict[str, Tool]:
    """Every tool, by name (the modules that declare them are imported once)."""
    if not _LOADED:
        for module in TOOL_MODULES:
            importlib.import_module(f"agentbatch.tools.{module}")
        missing = set(ALL_TOOL_NAMES) - set(_REGISTRY)
        if missing:
            raise RuntimeError(f"tools declared in a toolset but by no module: {sorted(missing)}")
        _LOADED.update((name, _REGISTRY[name]) for name in ALL_TOOL_NAMES)
    return dict(_LOADED)


def offered_tools(toolsets: list[str], settings: ToolSettings) -> list[Tool]:
    """The tools of the sampled toolsets that can work with these settings."""
    # Asked once per prompt: what a run's settings leave out is worked out once (a check may stat a file or
    # look for a package), by one thread: the hundreds of sessions a run starts at once all ask at once, and
    # each working it out again was ~0.6 ms of CPU per session start.
    usable = _usable.get(id(settings))
    if usable is None or usable[0] is not settings:
        with _usable_lock:
            usable = _usable.get(id(settings))
            if usable is None or usable[0] is not settings:
                if len(_usable) > 64:
                    _usable.clear()
                usable = _usable[id(settings)] = (
                    settings,
                    {n: t for n, t in load_tools().items() if t.unavailable(settings) is None},
                )
    tools = usable[1]
    return [tools[name] for ts in toolsets for name in TOOLSETS[ts] if name in tools]


_usable: dict[int, tuple[ToolSettings, dict[str, Tool]]] = {}
_usable_lock = threading.Lock()


def unavailable_tools(settings: ToolSettings) -> dict[str, str]:
    """Tool name → why it is left out of the offered tools."""
    out = {}
    for name, t in load_tools().items():
        reason = t.unavailable(settings)
        if reason:
            out[name] = reason
    return out


def call_tool(t: Tool, raw_arguments: str, ctx: ToolContext) -> tuple[str, bool]:
    """Run a tool on the model's JSON arguments; returns (result JSON string, whether the call succeeded).

    The result is what the endpoint is sent next: secrets are redacted from it (before any cut, so no
    prefix of one survives) and lone surrogates replaced. A sandbox that vanished is no tool error: it
    propagates and fails the prompt.
    """
    try:
        args = json.loads(raw_arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except (ValueError, RecursionError) as e:
        return json.dumps({"error": f"invalid JSON arguments: {_short(e)}"}), False
    try:
        result = t.function(ctx, **t.arguments(args))
    except ArgumentError as e:
        result = {"error": f"invalid arguments: {e}"}
    except SandboxLost:
        raise
    except Exception as e:  # the model's call broke the tool: it sees why and may try again
        result = {"error": f"{type(e).__name__}: {e}"}
    ok = not (isinstance(result, dict) and result.get("error"))
    if isinstance(result, dict):  # cap inside the values so the result stays valid JSON
        limit = ctx.settings.max_output_chars
        result = {k: cap_output(ctx.redact(v), limit) if isinstance(v, str) else v for k, v in result.items()}
    return scrub(ctx.redact(json.dumps(result, ensure_ascii=False))), ok


def _short(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


def cap_output(text: str, limit: int) -> str:
    """Keep the head and the tail of an over-long text, marking what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"
