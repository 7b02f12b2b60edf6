"""A plug-in tool module for the tests: its tools form the toolset `word_tools` (the module's name)."""

from typing import Annotated

from agentbatch import ToolContext, tool


@tool
def shout(ctx: ToolContext, text: Annotated[str, "what to shout"], times: int = 1) -> dict:
    """Upper-case a text, repeated."""
    return {"output": " ".join([text.upper()] * times)}
