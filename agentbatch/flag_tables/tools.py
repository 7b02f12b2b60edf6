"""The run's tools: its distribution, its own tools and MCP servers, and the tools' settings.

The `tools` group of the settings (settings.ToolFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

from typing import Any

import agentbatch.flag_checks as check
from agentbatch.errors import FatalError
from agentbatch.flag_type import Flag, text_flag


def _distribution(name: str, value: Any) -> str:
    """The name; which distributions exist is known once --distributions_file is read (tool_set.distributions)."""
    text = str(value).strip()
    if not text:
        raise FatalError(f"--{name} is empty; see --list_distributions")
    return text


FLAGS: tuple[Flag, ...] = (
    text_flag(
        "distribution", "default", "toolset distribution, see --list_distributions", _distribution, group="tools"
    ),
    Flag(
        "tools",
        None,
        "your own tool modules: Python modules or .py files (comma-separated) of `@tool` functions, each module a "
        "toolset (see docs/tools.md)",
        check.name_list,
        kind=str,
        group="tools",
    ),
    text_flag(
        "mcp_config",
        None,
        "an mcp.json of MCP servers (stdio or Streamable HTTP) whose tools the run offers, each server a toolset "
        "(see docs/tools.md)",
        check.input_file,
        group="tools",
    ),
    text_flag(
        "distributions_file",
        None,
        "a JSON or YAML file of distributions (toolset: percent) added to the built-ins, or replacing one of the "
        "same name (see docs/tools.md)",
        check.input_file,
        group="tools",
    ),
    Flag("command_timeout", 60.0, "seconds a terminal command may run", check.seconds, group="tools"),
    Flag(
        "allow_private_urls",
        False,
        "let web and browser tools reach private and loopback addresses",
        check.boolean,
        group="tools",
    ),
    text_flag("vision_model", None, "model of vision_analyze and browser_vision", shown="--model", group="tools"),
    text_flag(
        "image_model", None, "model of image_generate, which is offered only with one (or IMAGE_MODEL)", group="tools"
    ),
    text_flag(
        "image_base_url",
        None,
        "endpoint of image_generate; the run's API key goes there only on --base_url's scheme, host and port, "
        "elsewhere IMAGE_API_KEY does (set it to the run's key to send that key)",
        check.optional_url,
        shown="--base_url",
        group="tools",
    ),
    Flag(
        "moa_models",
        None,
        "reference models of mixture_of_agents (comma-separated), which is offered only with some",
        check.name_list,
        kind=str,
        group="tools",
    ),
    text_flag("moa_aggregator", None, "aggregator model of mixture_of_agents", shown="--model", group="tools"),
)
