"""An MCP server's tools as the model is offered them (OpenAI function schemas), and their results as JSON.

A tool list is checked once, at start: every name must be a function name an OpenAI-compatible endpoint
takes (after the server's `prefix`), every input schema a JSON Schema object. A result becomes
`{"content": text}`, or `{"error": text}` when the server says the call failed (`isError`): the text
blocks joined, other blocks (images, audio, resources) named by a placeholder the model can read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from agentbatch.mcp.config import ServerConfig

# What OpenAI's API (and the endpoints copying it) accept as a function's name.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolListError(ValueError):
    """A server's tool list cannot be offered as it is."""


@dataclass(frozen=True)
class McpTool:
    """One tool of one server, as listed at start: the name the model sees, the server's name for it, its schema."""

    server: str
    name: str
    remote_name: str
    description: str
    parameters: dict[str, Any]

    def schema(self) -> dict:
        """The OpenAI function-tool schema."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def offered_tools(server: ServerConfig, listed: list[types.Tool]) -> tuple[McpTool, ...]:
    """The tools of a server's list the run offers (its `tools` key picks some); ToolListError if one cannot be."""
    by_name = {}
    for t in listed:
        if t.name in by_name:
            raise ToolListError(f"it lists the tool {t.name!r} twice")
        by_name[t.name] = t
    if server.tools is not None:
        missing = [n for n in server.tools if n not in by_name]
        if missing:
            raise ToolListError(
                f"its config names the tool {missing[0]!r}, which it does not have; it has: {', '.join(by_name)}"
            )
        chosen = [by_name[n] for n in server.tools]
    else:
        chosen = list(by_name.values())
    if not chosen:
        raise ToolListError("it lists no tools")
    return tuple(_tool(server, t) for t in chosen)


def _tool(server: ServerConfig, t: types.Tool) -> McpTool:
    name = server.prefix + t.name
    if not FUNCTION_NAME.match(name):
        hint = "" if server.prefix else ' (a "tools" list in its config can leave it out)'
        raise ToolListError(
            f"tool name {name!r} is not a function name endpoints accept: 1 to 64 letters, digits, _ or -{hint}"
        )
    schema = t.input_schema
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise ToolListError(f"tool {t.name!r}: its inputSchema is not a JSON Schema of type object")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ToolListError(f"tool {t.name!r}: its inputSchema's properties is not an object")
    parameters = {k: v for k, v in schema.items() if k != "$schema"}
    parameters.setdefault("properties", {})
    try:
        json.dumps(parameters)
    except (TypeError, ValueError) as e:
        raise ToolListError(f"tool {t.name!r}: its inputSchema is not JSON: {e}") from None
    description = " ".join((t.description or t.title or "").split())
    return McpTool(server.name, name, t.name, description, parameters)


def result(reply: types.CallToolResult) -> dict:
    """The JSON the model sees for a server's reply: {"content": text}, or {"error": text} if it failed."""
    parts = [_text(block) for block in reply.content]
    text = "\n".join(p for p in parts if p)
    if not text and reply.structured_content is not None:
        text = json.dumps(reply.structured_content, ensure_ascii=False)
    if reply.is_error:
        return {"error": text or "the tool reported an error without a message"}
    return {"content": text}


def _text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        return f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes, not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        contents = block.resource
        if isinstance(contents, types.TextResourceContents):
            return contents.text
        return f"[resource {contents.uri}, {contents.mime_type or 'binary'}, not shown]"
    return f"[{getattr(block, 'type', 'unknown')} content, not shown]"
