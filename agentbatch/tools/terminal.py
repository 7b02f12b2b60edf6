"""The terminal toolset: one shell command in the sample's sandbox."""

from __future__ import annotations

from typing import Annotated

from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool


@tool()
def terminal(
    ctx: ToolContext,
    command: Annotated[str, "The shell command to run."],
    timeout: Annotated[float | None, "Seconds before the command is killed (capped)."] = None,
) -> dict:
    """Run a shell command (bash, or sh in minimal containers) in your own sandboxed working directory.
    Returns its combined stdout/stderr and exit code. Commands time out; nothing runs in the background."""
    if not command.strip():
        return {"output": "", "exit_code": None, "error": "command must be a non-empty string"}
    limit = ctx.settings.command_timeout
    # A zero, negative or absurd timeout from the model falls back to the limit rather than killing at once.
    chosen = min(timeout, limit) if timeout is not None and timeout >= 1 else limit
    sandbox = ctx.sandbox()
    cut = ctx.limits.cap(chosen)  # the sample's deadline cuts the command too
    result = sandbox.exec(command, timeout=cut)
    error = None
    if result.timed_out:
        error = f"command timed out after {chosen:g} s" if cut >= chosen else "the sample's time limit cut the command"
    return {"output": result.output, "exit_code": result.exit_code, "error": error}
