"""The terminal toolset: one shell command in the prompt's sandbox."""

from __future__ import annotations

from tool_registry import Tool, ToolContext, register


def terminal(args: dict, ctx: ToolContext) -> dict:
    command = args.get("command")
    if not isinstance(command, str) or not command.strip():
        return {"output": "", "exit_code": None, "error": "command must be a non-empty string"}
    limit = ctx.settings.command_timeout
    try:
        asked = float(args.get("timeout") or limit)
    except (TypeError, ValueError):
        asked = limit
    # A zero, negative or absurd timeout from the model falls back to the limit rather than killing at once.
    timeout = min(asked, limit) if asked >= 1 else limit
    result = ctx.sandbox().exec(command, timeout=timeout)
    error = f"command timed out after {timeout:g} s" if result.timed_out else None
    return {"output": result.output, "exit_code": result.exit_code, "error": error}


register(
    Tool(
        name="terminal",
        description=(
            "Run a shell command (bash, or sh in minimal containers) in your own sandboxed working directory. "
            "Returns its combined stdout/stderr and exit code. Commands time out; nothing runs in the background."
        ),
        parameters={
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command to run."},
                "timeout": {"type": "number", "description": "Seconds before the command is killed (capped)."},
            },
            "required": ["command"],
        },
        handler=terminal,
    )
)
