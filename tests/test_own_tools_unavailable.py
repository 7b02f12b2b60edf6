"""A run's own tool that its settings cannot support is left out with one warning at start, through the real CLI,
whether its toolset is offered to every sample (the distribution does not name it) or at a percent."""

from __future__ import annotations

import json

from cli_helpers import assert_clean_exit, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

MODULE = '''
from agentbatch import ToolContext, tool

TOOLSET = "acme"


@tool(unavailable=lambda settings: "needs the ACME service")
def acme_lookup(ctx: ToolContext, q: str) -> dict:
    """Look a thing up at ACME."""
    return {"output": q}


@tool
def acme_echo(ctx: ToolContext, q: str) -> dict:
    """Echo a thing."""
    return {"output": q}
'''


def offered(request: dict) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


def test_an_unavailable_own_tool_offered_to_every_sample_is_left_out_with_a_warning(tmp_path):
    module = tmp_path / "acme.py"
    module.write_text(MODULE)
    args = [
        f"--dataset_file={write_dataset(tmp_path / 'data.jsonl', ['p'])}",
        "--batch_size=5",
        "--run_name=r",
        "--sandbox=local",
        f"--tools={module}",
        "--distribution=minimal",
    ]
    with ScriptedServer(script={"p": [thinking("done")]}) as server:
        proc = run_cli(args, tmp_path, server, timeout=120)
        (request,) = server.requests()
    assert_clean_exit(proc)
    assert "acme offered to every sample" in proc.stderr
    assert "warning: not offered: acme_lookup: needs the ACME service\n" in proc.stderr, proc.stderr
    assert "acme_echo" in offered(request) and "acme_lookup" not in offered(request), json.dumps(request)[:2000]
