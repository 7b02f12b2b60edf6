"""How a tool is declared, offered and called (docs/tools.md is the public reference).

A tool is a function decorated with `@tool`: its name is the tool's name, its docstring the description,
and its typed parameters (after the context) the JSON schema the model sees and the check its arguments
pass before the function runs. `Annotated[str, "text"]` gives a parameter its description; a parameter
with a default is optional. What the function returns (a dict) goes back to the model as JSON; a
non-empty "error" marks the call failed.

Every tool belongs to one toolset, the unit distributions sample: a built-in tool to its row of
toolset_distributions.TOOLSETS, a plug-in's to `@tool(toolset=...)`, else its module's `TOOLSET`, else its
module's name. Built-in and plug-in tools register the same way: their module is imported by the one
plug-in loader (agentbatch/plugins.py). A tool declared by a JSON schema rather than by a function's types
(an MCP server's, agentbatch/mcp/) is registered with `register` and gets the model's arguments unchanged.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import sys
import threading
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from agentbatch.registry import Registered, Registry, origin_of
from agentbatch.sandboxes.base import SandboxLost
from agentbatch.surrogates import scrub
from agentbatch.tools.context import ToolContext
from agentbatch.tools.results import cap_output as cap_output  # where the checks and web tools take it
from agentbatch.tools.results import result_text
from agentbatch.tools.settings import ToolSettings
from toolset_distributions import ALL_TOOL_NAMES, TOOLSET_OF, TOOLSETS

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
    toolset: str = ""
    # A JSON Schema of the arguments given as it is (an MCP server's tool): offered verbatim, the arguments
    # passed on unchecked (the server checks them); None: the schema is made from `params`.
    parameters: dict | None = None
    origin: str = ""  # who declared it, for a clash's message (default: the function's module and name)

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
        if self.parameters is not None:
            parameters = self.parameters
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def arguments(self, args: dict) -> dict:
        """The keyword arguments of the function, checked and converted; raises ArgumentError."""
        if self.parameters is not None:
            return args
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


_SCHEMAS: dict[str, tuple[Tool, dict]] = {}


class ToolDeclarationError(ValueError):
    """A tool cannot be declared: its name or toolset clashes with another, or its parameters have no schema."""


def tool(
    fn: Callable[..., dict] | None = None,
    *,
    name: str | None = None,
    toolset: str | None = None,
    unavailable: Callable[[ToolSettings], str | None] | None = None,
    aliases: dict[str, str] | None = None,
):
    """Declare the decorated function as a tool: `@tool`, or `@tool(toolset=..., name=..., unavailable=...)`.

    `unavailable(settings)` says why the tool cannot be offered with the run's settings (or None);
    `aliases` maps argument names models often use to the declared ones.
    """

    def declare(fn: Callable[..., dict]) -> Callable[..., dict]:
        tool_name = name or fn.__name__
        declared = Tool(
            name=tool_name,
            description=" ".join((fn.__doc__ or "").split()),
            params=_params(fn),
            function=fn,
            unavailable=unavailable or (lambda settings: None),
            aliases=tuple((aliases or {}).items()),
            toolset=_toolset_of(fn, tool_name, toolset),
        )
        _register(declared)
        return fn

    return declare(fn) if fn is not None else declare


def _toolset_of(fn: Callable, name: str, given: str | None) -> str:
    module = getattr(fn, "__module__", "") or ""
    if module.startswith("agentbatch.tools."):  # a built-in: its row of the built-in table
        if name not in TOOLSET_OF:
            raise ToolDeclarationError(f"{name} is not a tool of any built-in toolset")
        return TOOLSET_OF[name]
    if given:
        return given
    declared = getattr(sys.modules.get(module), "TOOLSET", None)
    return declared if isinstance(declared, str) and declared else module.rpartition(".")[2]


def register(t: Tool) -> None:
    """Add a tool made elsewhere than by `@tool` (an MCP server's); ToolDeclarationError if its name or toolset clashes."""
    _register(t)


def _register(t: Tool) -> None:
    TOOLS.add(t.name, t, _origin(t))


def _clash(name: str, known: Registered[Tool], new: Registered[Tool]) -> Exception:
    builtin = name in TOOLSET_OF and known.origin.startswith("agentbatch.")
    return ToolDeclarationError(
        f"tool {name!r} of {new.origin} clashes with {'the built-in tool' if builtin else 'the tool'} {name!r} of "
        f"{known.origin} (toolset {known.item.toolset!r}); rename one"
    )


def _check_toolset(t: Tool) -> None:
    if t.toolset in TOOLSETS and t.name not in TOOLSET_OF:  # the built-in distributions mean the built-in tools
        raise ToolDeclarationError(
            f"toolset {t.toolset!r} of {_origin(t)} is a built-in toolset's name; choose another"
        )


def _origin(t: Tool) -> str:
    return t.origin or origin_of(t.function)


TOOLS: Registry[Tool] = Registry("tool", clash=_clash, check=_check_toolset)


def _params(fn: Callable) -> tuple[Param, ...]:
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as e:  # a name the annotations use is not defined
        raise ToolDeclarationError(f"tool {fn.__name__}: its type annotations do not resolve ({e})") from e
    params = []
    for name, parameter in list(inspect.signature(fn).parameters.items())[1:]:  # the first is the context
        if name not in hints:
            raise ToolDeclarationError(f"tool {fn.__name__}: parameter {name!r} has no type annotation")
        hint, description = hints[name], None
        if typing.get_origin(hint) is Annotated:
            hint, description = typing.get_args(hint)[0], typing.get_args(hint)[1]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))  # Optional: not required
        required = parameter.default is inspect.Parameter.empty
        default = None if required else parameter.default
        if typing.get_origin(hint) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(hint)):
            params.append(Param(name, "string", description, required, default, typing.get_args(hint)))
        elif hint in _JSON_TYPES or hint == list[str]:
            kind = "array" if hint == list[str] else _JSON_TYPES[hint]
            params.append(Param(name, kind, description, required, default))
        else:
            raise ToolDeclarationError(
                f"tool {fn.__name__}: parameter {name!r} is a {getattr(hint, '__name__', hint)}, which the schema "
                "cannot express; use str, int, float, bool, list[str] or Literal of strings"
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
    """Every tool, by name: the built-ins in their table's order, then the plug-ins' (plugins.load imports them)."""
    registered = TOOLS.items()
    missing = set(ALL_TOOL_NAMES) - set(registered)
    if missing:
        raise RuntimeError(f"tools declared in a toolset but by no module: {sorted(missing)}")
    builtins = {name: registered[name] for name in ALL_TOOL_NAMES}
    return {**builtins, **{n: t for n, t in registered.items() if n not in builtins}}


def toolsets() -> dict[str, tuple[str, ...]]:
    """Every toolset and its tools: the built-in table's, then the plug-ins' in the order they registered."""
    out = {ts: list(names) for ts, names in TOOLSETS.items()}
    for t in load_tools().values():
        if t.name not in TOOLSET_OF:
            out.setdefault(t.toolset, []).append(t.name)
    return {ts: tuple(names) for ts, names in out.items()}


def offered_tools(toolsets: list[str], settings: ToolSettings) -> list[Tool]:
    """The tools of the sampled toolsets that can work with these settings."""
    # Asked once per sample: what a run's settings leave out is worked out once (a check may stat a file or
    # look for a package), by one thread: the hundreds of samples a run starts at once all ask at once, and
    # each working it out again was ~0.6 ms of CPU per sample start.
    usable = _usable.get(id(settings))
    if usable is None or usable[0] is not settings:
        with _usable_lock:
            usable = _usable.get(id(settings))
            if usable is None or usable[0] is not settings:
                if len(_usable) > 64:
                    _usable.clear()
                by_toolset: dict[str, list[Tool]] = {}
                for t in load_tools().values():
                    if t.unavailable(settings) is None:
                        by_toolset.setdefault(t.toolset, []).append(t)
                usable = _usable[id(settings)] = (settings, by_toolset)
    by_toolset = usable[1]
    return [t for ts in toolsets for t in by_toolset.get(ts, ())]


_usable: dict[int, tuple[ToolSettings, dict[str, list[Tool]]]] = {}
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
    prefix of one survives), the whole is capped to max_output_chars (tools/results.py), and lone
    surrogates are replaced. Whatever the tool raises is that call's error, KeyboardInterrupt and
    CancelledError too (a worker leaves Ctrl-C to the runner, so neither is one), except a sandbox that
    vanished: that propagates and fails the sample.
    """
    try:
        args = json.loads(raw_arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
    except (ValueError, RecursionError) as e:
        return json.dumps({"error": f"invalid JSON arguments: {_short(e)}"}), False
    pid = os.getpid()
    try:
        result = t.function(ctx, **t.arguments(args))
    except ArgumentError as e:
        result = {"error": f"invalid arguments: {e}"}
    except SandboxLost:
        raise
    except BaseException as e:  # the model's call broke the tool: it sees why and may try again
        result = {"error": f"{type(e).__name__}: {e}" if str(e) else type(e).__name__}
    finally:
        if os.getpid() != pid:  # a child the tool forked, returning: only its worker may go on with the sample
            os._exit(0)
    ok = not (isinstance(result, dict) and result.get("error"))
    try:
        text = result_text(result, ctx.settings.max_output_chars, ctx.redact, ok)
    except (TypeError, ValueError, RecursionError) as e:  # a tool's bug the model sees, as an exception
        text, ok = json.dumps({"error": f"the tool returned something that is not JSON: {_short(e)}"}), False
    return scrub(ctx.redact(text)), ok


def _short(e: BaseException) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)
