"""--mcp_config in the real CLI: MCP servers' tools in trajectories, servers that fail, and secrets kept out."""

from __future__ import annotations

import base64
import json
import socket
import subprocess

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, thinking, write_dataset
from mcp_helpers import BUSYBOX_SERVER, HttpServer, fastmcp, filesystem, python_server, raw, raw_inline
from scripted_server import ScriptedServer

from toolset_distributions import ALL_TOOL_NAMES

SECRET = "mcp-env-secret-0123456789"


def calls(*pairs) -> dict:
    return {"reasoning": "calling", "tool_calls": [{"name": n, "arguments": a} for n, a in pairs]}


def run(tmp_path, server, servers: dict, rows, dist: dict, *flags, name="mcp"):
    (tmp_path / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    (tmp_path / "dists.json").write_text(json.dumps({"mine": dist}))
    args = [
        f"--dataset_file={write_dataset(tmp_path / 'data.jsonl', rows)}",
        "--batch_size=10",
        f"--run_name={name}",
        "--sandbox=local",
        f"--mcp_config={tmp_path / 'mcp.json'}",
        f"--distributions_file={tmp_path / 'dists.json'}",
        "--distribution=mine",
        *flags,
    ]
    return run_cli(args, tmp_path, server)


def results(line: dict) -> list[tuple[str, dict]]:
    return [(t["name"], json.loads(t["value"])) for t in line["conversations"] if t["from"] == "tool"]


def by_prompt(run_dir: RunDir) -> dict[str, dict]:
    return {r["conversations"][0]["value"]: r for r in run_dir.trajectories()}


def test_real_servers_in_each_samples_sandbox_and_shared_on_the_host(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    servers = {
        "time": python_server("mcp_server_time", "--local-timezone=UTC"),
        "git": python_server("mcp_server_git", "--repository", str(repo), shared=True),
        "files": filesystem(".", prefix="fs_"),  # "." is the sample's own directory: it runs in its sandbox
        "mine": fastmcp(shared=True),
    }
    script = {
        "what time": [
            calls(
                ("get_current_time", {"timezone": "Europe/Paris"}),
                ("git_status", {"repo_path": str(repo)}),
                ("fs_write_file", {"path": "note.txt", "content": "from the model"}),
                ("fs_list_directory", {"path": "."}),
                ("add", {"a": 2, "b": 40}),
                ("where", {}),
            ),
            thinking("it is late"),
        ],
        "again": [calls(("fs_list_directory", {"path": "."}), ("where", {})), thinking("empty")],
    }
    with ScriptedServer(script=script) as server:
        proc = run(
            tmp_path,
            server,
            servers,
            ["what time", "again"],
            {"time": 100, "git": 100, "files": 100, "mine": 100},
            "--num_workers=1",
        )
    assert_clean_exit(proc)
    lines = by_prompt(RunDir(tmp_path / "data" / "mcp"))
    first = dict(results(lines["what time"]))
    assert json.loads(first["get_current_time"]["content"])["timezone"] == "Europe/Paris"
    assert "On branch" in first["git_status"]["content"]
    assert "Successfully wrote to note.txt" in first["fs_write_file"]["content"]
    assert "[FILE] note.txt" in first["fs_list_directory"]["content"]
    assert first["add"] == {"content": "42"}
    second = dict(results(lines["again"]))
    assert "note.txt" not in second["fs_list_directory"]["content"]  # its own sandbox, its own server
    # The shared server: one process for both samples of the one worker, running on the host.
    pids = {json.loads(d["where"]["content"])["pid"] for d in (first, second)}
    assert len(pids) == 1
    line = lines["what time"]
    assert line["toolsets_used"] == ["time", "git", "files", "mine"]
    offered = {s["function"]["name"]: s["function"] for s in json.loads(line["tools"])}
    assert offered["add"]["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert "fs_read_text_file" in offered and "read_text_file" not in offered
    names = list(line["tool_stats"])
    assert names[: len(ALL_TOOL_NAMES)] == list(ALL_TOOL_NAMES) and "git_status" in names and "fs_write_file" in names
    assert list(lines["again"]["tool_stats"]) == names
    assert line["tool_stats"]["get_current_time"] == {"count": 1, "success": 1, "failure": 0}


def test_a_server_the_distribution_does_not_name_is_offered_to_every_sample(tmp_path):
    script = {"where": [calls(("whereami", {}), ("hub_whereami", {})), thinking("here")]}
    servers = {"raw": raw("ok"), "hub": raw("ok", shared=True, prefix="hub_"), "off": raw("ok", prefix="off_")}
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, servers, ["where"], {"terminal": 100, "hub": 50, "off": 0}, "--seed=1")
    assert_clean_exit(proc)
    assert "own toolsets, distribution 'mine': raw offered to every sample (the distribution does not name them); " in (
        proc.stderr
    )
    assert "hub at 50%; off never (0%)" in proc.stderr
    (line,) = RunDir(tmp_path / "data" / "mcp").trajectories()
    drawn = ["terminal", "hub"] if "hub" in line["toolsets_used"] else ["terminal"]  # hub at its 50%
    assert line["toolsets_used"] == [*drawn, "raw"]
    assert "content" in results(line)[0][1] and "off_whereami" not in line["tools"]


def test_a_server_that_dies_mid_call_fails_that_call_and_the_next_sample_gets_a_new_one(tmp_path):
    script = {
        "crash it": [calls(("whereami", {}), ("crash", {}), ("whereami", {})), thinking("it died")],
        "after": [calls(("whereami", {})), thinking("alive")],
    }
    servers = {"raw": raw("ok"), "hub": raw("ok", shared=True, prefix="hub_")}
    script["crash hub"] = [calls(("hub_whereami", {}), ("hub_crash", {}), ("hub_whereami", {})), thinking("x")]
    with ScriptedServer(script=script) as server:
        proc = run(
            tmp_path,
            server,
            servers,
            ["crash it", "after", "crash hub"],
            {"raw": 100, "hub": 100},
            "--num_workers=1",
        )
    assert_clean_exit(proc)
    lines = by_prompt(RunDir(tmp_path / "data" / "mcp"))
    crashed = results(lines["crash it"])
    assert crashed[0][1]["content"]
    assert crashed[1] == (
        "crash",
        {"error": "MCP server 'raw' exited with code 3 (stderr: raw_server: crashing as asked)"},
    )
    assert crashed[2] == ("whereami", crashed[1][1])  # dead for the rest of the sample
    assert lines["crash it"]["tool_stats"]["whereami"] == {"count": 2, "success": 1, "failure": 1}
    (after,) = results(lines["after"])
    assert "content" in after[1]
    hub = results(lines["crash hub"])
    assert "MCP server 'hub' exited with code 3" in hub[1][1]["error"]
    assert "content" in hub[2][1]  # a shared server is started again at the next call after it died


def test_a_call_the_server_never_answers_fails_after_the_command_timeout(tmp_path):
    script = {"stall": [calls(("stall", {}), ("whereami", {})), thinking("gave up")]}
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, {"raw": raw("ok")}, ["stall"], {"raw": 100}, "--command_timeout=2")
    assert_clean_exit(proc)
    (line,) = RunDir(tmp_path / "data" / "mcp").trajectories()
    stalled = results(line)
    assert stalled[0] == ("stall", {"error": "MCP server 'raw' did not answer the call of stall in 2 s"})
    assert stalled[1][1]["error"].startswith("MCP server 'raw' did not answer the call of whereami")


def test_a_streamable_http_server_on_loopback(tmp_path):
    http = HttpServer()
    try:
        script = {"add": [calls(("add", {"a": 1, "b": 2})), thinking("3")]}
        with ScriptedServer(script=script) as server:
            proc = run(tmp_path, server, {"remote": {"url": http.url}}, ["add"], {"remote": 100})
        assert_clean_exit(proc)
    finally:
        http.close()
    (line,) = RunDir(tmp_path / "data" / "mcp").trajectories()
    assert results(line) == [("add", {"content": "3"})]


def test_a_servers_env_reaches_it_alone_and_is_redacted_from_every_output(tmp_path):
    calling = calls(
        ("whereami", {}),
        ("other_whereami", {}),
        ("terminal", {"command": "echo value=${MCP_TEST_VALUE:-unset}"}),
    )
    script = {"where": [calling, thinking(f"the value was {SECRET}")]}
    servers = {"raw": raw("ok", env={"MCP_TEST_VALUE": SECRET}), "other": raw("ok", prefix="other_")}
    with ScriptedServer(script=script) as server:
        proc = run(
            tmp_path, server, servers, ["where"], {"raw": 100, "other": 100, "terminal": 100}, "--export=openai,atif"
        )
        sent = json.dumps(server.requests())
    assert_clean_exit(proc)
    assert SECRET not in sent  # the tool result the endpoint saw
    run_dir = tmp_path / "data" / "mcp"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in proc.stdout + proc.stderr
    (line,) = RunDir(run_dir).trajectories()
    mine, other, terminal = (value for _, value in results(line))
    assert json.loads(mine["content"])["value"] == "[REDACTED]"
    assert json.loads(other["content"])["value"] == ""  # another server does not get it
    assert "value=unset" in terminal["output"]  # nor do the sample's commands


@pytest.mark.parametrize(
    "servers, says",
    [
        ({"raw": raw("hang")}, "error: --mcp_config: server 'raw' did not answer its initialization in 3 s"),
        ({"raw": raw("invalid_list")}, "error: --mcp_config: server 'raw' sent a reply that is not valid MCP"),
        ({"raw": {"command": "no-such-server-binary"}}, "exec: no-such-server-binary: not found); it runs in each"),
        (
            {"raw": {"command": "no-such-server-binary", "shared": True}},
            "cannot start: command 'no-such-server-binary'",
        ),
        ({"raw": raw("ok", shraed=True)}, "server 'raw': unknown key 'shraed'"),
        ({"web": raw("ok")}, "server 'web': its name is a built-in toolset; rename it"),
        (
            {"raw": {"command": "sh", "args": ["-c", f"echo {SECRET} >&2; exit 1"], "env": {"K": SECRET}}},
            "error: --mcp_config: server 'raw' exited with code 1 (stderr: [REDACTED])",
        ),
        ({"raw": raw("ok", tools=["nope"])}, "its config names the tool 'nope', which it does not have"),
        ({"a": raw("ok"), "b": raw("ok")}, "tool 'whereami' of MCP server 'b' clashes with the tool 'whereami'"),
    ],
)
def test_a_server_that_cannot_be_used_stops_the_run_before_any_model_call(tmp_path, servers, says):
    with ScriptedServer(script={}) as server:
        proc = run(tmp_path, server, servers, ["q"], {next(iter(servers)): 100}, "--command_timeout=3")
        assert server.requests() == []
    assert_clean_exit(proc, 2)
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert SECRET not in proc.stderr
    assert not (tmp_path / "data" / "mcp").exists()


def test_a_stdio_server_inside_a_bwrap_sandbox(tmp_path):
    from agentbatch.sandboxes import bwrap
    from agentbatch.sandboxes.base import SandboxSettings

    why_not = bwrap.probe(SandboxSettings(kind="bwrap"))
    if why_not:
        pytest.skip(f"bwrap does not work here: {why_not}")
    script = {"where": [calls(("whereami", {})), thinking("here")]}
    servers = {"raw": raw_inline("ok", env={"MCP_TEST_VALUE": "seen"})}  # the test files are not in its view
    with ScriptedServer(script=script) as server:
        proc = run(tmp_path, server, servers, ["where"], {"raw": 100}, "--sandbox=bwrap")
    assert_clean_exit(proc)
    (line,) = RunDir(tmp_path / "data" / "mcp").trajectories()
    where = json.loads(results(line)[0][1]["content"])
    # In the sample's sandbox: its working directory, and a PID namespace of its own.
    assert where["cwd"] == "/workspace" and where["pid"] < 10 and where["value"] == "seen"


def test_a_server_a_bwrap_sandbox_cannot_see_stops_the_start_with_a_hint(tmp_path):
    from agentbatch.sandboxes import bwrap
    from agentbatch.sandboxes.base import SandboxSettings

    if bwrap.probe(SandboxSettings(kind="bwrap")):
        pytest.skip("bwrap does not work here")
    with ScriptedServer(script={}) as server:
        proc = run(tmp_path, server, {"raw": raw("ok")}, ["q"], {"raw": 100}, "--sandbox=bwrap")
    assert_clean_exit(proc, 2)
    assert "server 'raw' exited with code 2" in proc.stderr and "can't open file" in proc.stderr
    assert '"shared": true' in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.docker
def test_a_stdio_server_inside_a_docker_sandbox(tmp_path, docker_images, docker_run_name):
    script = {"where": [calls(("where", {})), thinking("in the container")]}
    servers = {"box": {"command": "sh", "args": ["-c", BUSYBOX_SERVER.read_text()]}}
    with ScriptedServer(script=script) as server:
        proc = run(
            tmp_path,
            server,
            servers,
            ["where"],
            {"box": 100},
            "--sandbox=docker",
            f"--docker_image={docker_images[0]}",
            name=docker_run_name,
        )
    assert_clean_exit(proc)
    (line,) = RunDir(tmp_path / "data" / docker_run_name).trajectories()
    (answer,) = results(line)
    assert answer[0] == "where" and answer[1]["content"].endswith(" in /workspace")
    host = answer[1]["content"].split()[1]
    assert len(host) == 12 and host != socket.gethostname()  # a container's name for itself


@pytest.mark.docker
def test_a_servers_env_is_out_of_reach_of_the_samples_commands_in_docker(tmp_path, docker_images, docker_run_name):
    """The agent's commands run as root in the container: /proc/N/environ of a process beside them is readable
    there. A server given an env runs in a container of its own, on the sample's network."""
    steal = "cat /proc/[0-9]*/environ | base64 | tr -d '\\n'; echo; ps -o pid,args"
    script = {"steal": [calls(("where", {}), ("terminal", {"command": steal})), thinking("nothing")]}
    servers = {"box": {"command": "sh", "args": ["-c", BUSYBOX_SERVER.read_text()], "env": {"MCP_TEST_VALUE": SECRET}}}
    with ScriptedServer(script=script) as server:
        proc = run(
            tmp_path,
            server,
            servers,
            ["steal"],
            {"box": 100, "terminal": 100},
            "--sandbox=docker",
            f"--docker_image={docker_images[0]}",
            name=docker_run_name,
        )
        sent = json.dumps(server.requests())
    assert_clean_exit(proc)
    (line,) = RunDir(tmp_path / "data" / docker_run_name).trajectories()
    (_, where), (_, stolen) = results(line)
    assert where["content"].endswith(" in /workspace; value [REDACTED]")  # it has its env
    environs, processes = stolen["output"].split("\n", 1)
    assert SECRET.encode() not in base64.b64decode(environs)  # it was there, base64 past the redactor
    assert "A stdio MCP server" not in processes and "sleep 3600" in processes  # not among the sample's processes
    assert base64.b64encode(SECRET.encode())[:16].decode() not in sent
    # The server's container went with the sample (docker_run_name checks that none is left).
