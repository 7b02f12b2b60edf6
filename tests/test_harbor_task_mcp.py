"""A task's own MCP servers ([environment] mcp_servers) through the real CLI, real Docker and real MCP servers
(docs/harbor.md, "MCP servers"): a stdio server run in the task's main container, and a Streamable HTTP server in a
Compose service that the run builds and reaches by the name the task gives it, both listed at start, offered to
the task's samples as toolsets of the run and called by the model."""

from __future__ import annotations

import json

import pytest
from cli_helpers import RunDir
from harbor_helpers import BUSYBOX, by_task, harbor_run, labelled, nothing_left, write_task
from mcp_helpers import BUSYBOX_SERVER, HERE
from scripted_server import ScriptedServer

pytestmark = pytest.mark.docker

CGI_SERVER = HERE / "mcp_servers" / "busybox_cgi.sh"
MCP_SERVICE = {
    "build": "./mcp",  # built by the run before any sample (Compose), tagged br-harbor/<task>-mcp:<hash>
    "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
    "healthcheck": {"test": ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8080/"], "interval": "1s"},
}


def test_a_tasks_stdio_and_http_servers_are_offered_to_its_samples(tmp_path, compose_binary, docker_run_name):
    root = tmp_path / "tasks"
    servers = [
        {"name": "box", "transport": "stdio", "command": "sh", "args": ["-c", BUSYBOX_SERVER.read_text()]},
        {"name": "web-mcp", "transport": "streamable-http", "url": "http://mcp:8080/cgi-bin/mcp"},
    ]
    tables = (
        "[[environment.mcp_servers]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in s.items()) for s in servers
    )
    toml = '[environment]\nworkdir = "/srv"\n' + "".join(tables)
    task = write_task(
        root,
        "tools",
        "grep -q 'served by' /logs/artifacts/said.txt && echo 1 > /logs/verifier/reward.txt\n",
        toml=toml,
        compose={"services": {"main": {"depends_on": {"mcp": {"condition": "service_healthy"}}}, "mcp": MCP_SERVICE}},
        files={
            "environment/mcp/Dockerfile": f"FROM {BUSYBOX}\nRUN mkdir -p /www/cgi-bin && echo ok > /www/index.html\n"
            "COPY mcp /www/cgi-bin/mcp\n",
            "environment/mcp/mcp": CGI_SERVER.read_text(),
        },
    )
    (task / "environment" / "mcp" / "mcp").chmod(0o755)
    write_task(root, "plain", "echo 1 > /logs/verifier/reward.txt\n")  # offered neither
    calls = {"tool_calls": [{"name": "where", "arguments": {}}, {"name": "served_by", "arguments": {}}]}
    said = {
        "tool_calls": [{"name": "terminal", "arguments": {"command": "echo served by it > /logs/artifacts/said.txt"}}]
    }
    script = {
        (task / "instruction.md").read_text(): [calls, said, {"content": "done"}],
        (root / "plain" / "instruction.md").read_text(): [{"content": "nothing to do"}],
    }
    out = tmp_path / "out"
    with ScriptedServer(script=script) as srv:
        flags = ("--require_reasoning=false", "--max_retries=0", "--distribution=terminal_only")
        done = harbor_run(root, out, docker_run_name, *flags, server=srv)

    assert done.returncode == 0, done.stderr
    run_dir = out / docker_run_name
    lines = by_task(RunDir(run_dir).trajectories())
    results = [t["value"] for t in lines["tools"]["conversations"] if t["from"] == "tool"]
    where, served = json.loads(results[0])["content"], json.loads(results[1])["content"]
    assert where.startswith("host ") and where.endswith(" in /srv")  # in the sample's main, its working directory
    assert served.startswith("served by ") and served.split()[-1] not in where  # by the mcp service, not main
    assert lines["tools"]["passed"]
    offered = {s["function"]["name"] for s in json.loads(lines["tools"]["tools"])}
    assert {"where", "served_by", "terminal"} <= offered
    assert "where" not in {s["function"]["name"] for s in json.loads(lines["plain"]["tools"])}  # the task's alone
    # The run's tool set holds them (so the merge and the exports know them), a toolset per server.
    recorded = json.loads((run_dir / "tools.json").read_text())["toolsets"]
    assert (recorded["box"], recorded["web-mcp"]) == (["where"], ["served_by"])
    assert (
        lines["tools"]["tool_stats"]["served_by"]["count"] == 1 and lines["plain"]["tool_stats"]["where"]["count"] == 0
    )
    assert "listing the MCP servers of 1 task(s)" in done.stderr
    assert nothing_left(run_dir), labelled(run_dir)
