"""The MCP client against real servers: mcp.json checks, tool lists read at start, calls, and servers that misbehave."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mcp_helpers import RAW_SERVER, SYSTEM_PYTHON, HttpServer, fastmcp, filesystem, python_server, raw

from agentbatch.errors import FatalError
from agentbatch.mcp import config, host, listing, loop, pipes, schemas
from agentbatch.mcp.connection import Connection, ServerError
from agentbatch.mcp.servers import Shared
from agentbatch.sandboxes.output import MAX_KEPT_OUTPUT


def parse(**entries):
    return config.parse({"mcpServers": entries}, "--mcp_config mcp.json")


def connect(entry: dict, timeout: float = 30) -> Connection:
    (server,) = parse(s=entry)
    connection = Connection(server, host.start(server))
    connection.start(timeout)
    return connection


@pytest.mark.parametrize(
    "data, says",
    [
        ([], 'expected {"mcpServers"'),
        ({"mcpServers": {}}, "no server in mcpServers"),
        ({"mcpServers": {"a b": {"command": "x"}}}, "server name 'a b': use letters, digits"),
        ({"mcpServers": {"s": "x"}}, "server 's': expected an object"),
        ({"mcpServers": {"s": {}}}, "give either a command (stdio) or a url"),
        ({"mcpServers": {"s": {"command": "x", "url": "http://h/"}}}, "give either a command"),
        ({"mcpServers": {"s": {"command": "x", "shraed": True}}}, "unknown key 'shraed'"),
        ({"mcpServers": {"s": {"command": "x", "args": "a b"}}}, "args must be a list of strings"),
        ({"mcpServers": {"s": {"command": "x", "env": {"A": 1}}}}, "env must be an object of strings"),
        ({"mcpServers": {"s": {"command": "x", "shared": "yes"}}}, "shared must be true or false"),
        ({"mcpServers": {"s": {"url": "ftp://h/"}}}, "expected an http:// or https:// address"),
        ({"mcpServers": {"s": {"command": "x", "type": "sse"}}}, "an SSE server needs a url"),
        ({"mcpServers": {"s": {"url": "http://h/", "shared": True}}}, "unknown key 'shared'"),
        ({"mcpServers": {"s": {"command": "x", "env": {"A": "${NOT_SET_ANYWHERE}"}}}}, "${NOT_SET_ANYWHERE}"),
        ({"mcpServers": {"s": {"command": "x", "tools": "a"}}}, "tools must be a list of tool names"),
        ({"mcpServers": {"s": {"command": "x", "prefix": "a.b"}}}, "prefix 'a.b'"),
    ],
)
def test_an_mcp_json_not_of_the_documented_shape_is_one_line(data, says):
    with pytest.raises(FatalError) as e:
        config.parse(data, "--mcp_config mcp.json")
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("--mcp_config mcp.json")


def test_the_usual_shape_with_variables_and_the_keys_other_clients_write(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": "mcp-server-time", "args": ["--local-timezone=${TZ_NAME:-UTC}"]},
                    "api": {"type": "http", "url": "https://example.com/mcp", "headers": {"X-Key": "${THE_KEY}"}},
                    "off": {"command": "x", "disabled": True},
                    "cline": {"command": "y", "autoApprove": [], "env": {"TOKEN": "abc"}, "shared": True},
                }
            }
        )
    )
    servers = config.load(str(path), {"THE_KEY": "k-123456789"}.get)
    assert [s.name for s in servers] == ["time", "api", "cline"]
    time_server, api, cline = servers
    assert time_server.args == ("--local-timezone=UTC",) and time_server.in_sandbox
    assert api.transport == "http" and api.headers == {"X-Key": "k-123456789"} and not api.in_sandbox
    assert cline.shared and not cline.in_sandbox and cline.secrets() == ("abc",)
    assert "k-123456789" not in repr(api) and "abc" not in repr(cline)
    with pytest.raises(FatalError, match="not JSON"):
        (tmp_path / "bad.json").write_text("{")
        config.load(str(tmp_path / "bad.json"))


def test_the_real_servers_list_their_tools_at_once(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    servers = parse(
        time=python_server("mcp_server_time", "--local-timezone=UTC"),
        git=python_server("mcp_server_git", "--repository", str(repo)),
        fs=filesystem(str(tmp_path), prefix="fs_"),
        mine=fastmcp(),
    )
    tools = {t.name: t for t in listing.list_tools(servers, 60)}
    assert {"get_current_time", "convert_time"} <= set(tools)
    assert {"git_status", "git_log", "git_diff"} <= set(tools)
    assert {"fs_read_text_file", "fs_list_directory", "fs_write_file"} <= set(tools)
    assert {"add", "where", "nap"} <= set(tools)
    assert tools["fs_list_directory"].remote_name == "list_directory" and tools["fs_list_directory"].server == "fs"
    add = tools["add"].schema()["function"]
    assert add["description"] == "Add two whole numbers."
    assert add["parameters"]["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert add["parameters"]["required"] == ["a", "b"]
    assert all("$schema" not in t.parameters and t.parameters["type"] == "object" for t in tools.values())


def test_a_call_gets_the_servers_result_or_its_error():
    connection = connect(raw("ok", env={"MCP_TEST_VALUE": "only-for-this-server"}))
    try:
        where = json.loads(schemas.result(connection.call("whereami", {}, 10))["content"])
        assert where["value"] == "only-for-this-server"
        assert schemas.result(connection.call("fail", {"why": "the disk is full"}, 10)) == {
            "error": "failed because the disk is full"
        }
        with pytest.raises(ServerError, match="answered with error -32602: Unknown tool: nope"):
            connection.call("nope", {}, 10)
        assert connection.alive
    finally:
        connection.close()
    assert connection.process.poll() is not None


def test_a_server_that_crashes_mid_call_fails_that_call_and_every_later_one():
    connection = connect(raw("ok"))
    with pytest.raises(ServerError) as e:
        connection.call("crash", {}, 20)
    assert str(e.value) == "exited with code 3 (stderr: raw_server: crashing as asked)"
    assert not connection.alive
    with pytest.raises(ServerError, match="exited with code 3"):
        connection.call("whereami", {}, 20)
    connection.close()


def test_a_call_the_server_never_answers_fails_after_its_timeout():
    connection = connect(raw("ok"))
    start = time.monotonic()
    with pytest.raises(ServerError, match="did not answer the call of stall in 1 s"):
        connection.call("stall", {}, 1)
    assert time.monotonic() - start < 8
    connection.close()
    assert connection.process.poll() is not None  # it never reads stdin again: killed after the grace


def test_a_servers_stderr_is_kept_to_its_tail():
    connection = connect(raw("ok"))
    try:
        assert schemas.result(connection.call("shout", {}, 20)) == {"content": "shouted"}
        kept = connection.process.stderr()
        assert len(kept) <= 2 * MAX_KEPT_OUTPUT + 100 and "bytes cut]" in kept
        assert pipes.last_line(kept) == "raw_server: done shouting"
    finally:
        connection.close()


def test_a_reply_that_is_not_mcp_fails_its_call_at_once_saying_so():
    connection = connect(raw("ok"))
    try:
        with pytest.raises(ServerError) as e:
            connection.call("stringly", {}, 20)  # {"result": "a string"}: once taken for no answer in 20 s
        assert str(e.value) == "sent a reply that is not valid MCP (result: Input should be a valid dictionary)"
        assert connection.alive and "content" in schemas.result(connection.call("whereami", {}, 10))
    finally:
        connection.close()


class _StringResultHandler(BaseHTTPRequestHandler):
    """A Streamable HTTP server in JSON mode whose tools/call result is a string."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if "id" not in body:  # a notification
            return self._send(202, b"")
        info = {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "h", "version": "1"},
        }
        result = info if body["method"] == "initialize" else "a string"
        self._send(200, json.dumps({"jsonrpc": "2.0", "id": body["id"], "result": result}).encode())

    def do_GET(self) -> None:  # no stream of server messages
        self._send(405, b"")

    def do_DELETE(self) -> None:
        self._send(200, b"")

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_a_url_servers_reply_that_is_not_mcp_fails_its_call_in_one_line():
    http = ThreadingHTTPServer(("127.0.0.1", 0), _StringResultHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        (server,) = parse(h={"url": f"http://127.0.0.1:{http.server_port}/mcp"})
        connection = Connection(server)
        connection.start(10)
        try:
            with pytest.raises(ServerError) as e:
                connection.call("anything", {}, 10)
        finally:
            connection.close()
    finally:
        http.shutdown()
    assert str(e.value).startswith("answered with error -32700: Failed to parse JSON response") and "\n" not in str(
        e.value
    )


def test_an_answer_after_200000_log_notifications_comes_in_time():
    connection = connect(raw("ok"))
    try:
        assert schemas.result(connection.call("chatty", {}, 10)) == {"content": "said a lot"}
        assert "content" in schemas.result(connection.call("whereami", {}, 10))  # nothing left queued
    finally:
        connection.close()


def test_empty_lines_before_the_answer_are_skipped_and_the_start_deadline_holds():
    blank = {"command": SYSTEM_PYTHON, "args": [str(RAW_SERVER), "blank", "300"]}  # 300 MB of them, then its answer
    connect(blank, timeout=10).close()  # once: 27 s, then "did not answer its initialization in 10 s"
    forever = {"command": SYSTEM_PYTHON, "args": [str(RAW_SERVER), "blank_forever"]}
    start = time.monotonic()
    with pytest.raises(ServerError, match="^did not answer its initialization in 3 s$"):
        connect(forever, timeout=3)
    # Its deadline, then the grace a server has to exit once its stdin is closed (it was 30 s, and a TimeoutError).
    assert time.monotonic() - start < 3 + pipes.EXIT_GRACE + 4


@pytest.mark.parametrize(
    "entry, says",
    [
        (raw("hang"), "server 's' did not answer its initialization in 2 s"),
        (raw("invalid_list"), "server 's' sent a reply that is not valid MCP (tools.0.inputSchema.type"),
        (raw("bad_name"), "server 's' has a tool list that cannot be offered: tool name 'has.dot' is not a function"),
        ({"command": "no-such-mcp-server"}, "server 's' cannot start: command 'no-such-mcp-server' not found on PATH"),
        ({"command": "sh", "args": ["-c", "echo no config here >&2; exit 7"]}, "exited with code 7 (stderr: no config"),
        (raw("ok", tools=["whereami", "missing"]), "its config names the tool 'missing', which it does not have"),
    ],
)
def test_a_server_that_cannot_be_offered_stops_the_start_with_one_line(entry, says):
    start = time.monotonic()
    with pytest.raises(FatalError) as e:
        listing.list_tools(parse(s=entry), 2)
    assert str(e.value).startswith("--mcp_config: ") and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert time.monotonic() - start < 20


def test_prefix_and_tools_choose_and_rename_what_is_offered():
    (tool,) = listing.list_tools(parse(s=raw("ok", prefix="raw_", tools=["whereami"])), 20)
    assert (tool.name, tool.remote_name, tool.server) == ("raw_whereami", "whereami", "s")


def test_the_listing_leaves_the_runner_one_thread_again():
    """The runner forks its workers only while it is one thread (executors/processes.py)."""
    loop.stop()  # an earlier test's loop
    before = threading.active_count()
    listing.list_tools(parse(a=raw("ok"), b=raw("ok", shared=True, prefix="b_")), 20)
    assert threading.active_count() == before, [t.name for t in threading.enumerate()]


def test_a_streamable_http_server_on_loopback():
    http = HttpServer()
    try:
        (server,) = parse(web={"url": http.url, "headers": {"Authorization": "Bearer not-checked-here"}})
        assert {t.name for t in listing.list_tools((server,), 30)} == {"add", "where", "nap"}
        connection = Connection(server)
        connection.start(30)
        try:
            assert schemas.result(connection.call("add", {"a": 2, "b": 40}, 10)) == {"content": "42"}
            with pytest.raises(ServerError, match="did not answer the call of nap in 1 s"):
                connection.call("nap", {"seconds": 5}, 1)
        finally:
            connection.close()
    finally:
        http.close()
    with pytest.raises(FatalError, match=r"server 'web' at http://127\.0\.0\.1:\d+/mcp cannot be reached"):
        listing.list_tools((server,), 5)


def test_an_sse_server_on_loopback():
    """The older HTTP+SSE transport, Harbor's default for a task's servers (task.toml mcp_servers)."""
    http = HttpServer(sse=True)
    try:
        (server,) = parse(old={"url": http.url, "type": "sse"})
        assert server.transport == "sse" and server.describe().endswith("(SSE)")
        assert {t.name for t in listing.list_tools((server,), 30)} == {"add", "where", "nap"}
        connection = Connection(server)
        connection.start(30)
        try:
            assert schemas.result(connection.call("add", {"a": 2, "b": 40}, 10)) == {"content": "42"}
        finally:
            connection.close()
    finally:
        http.close()


def test_a_shared_server_is_started_again_after_it_died():
    (server,) = parse(s=raw("ok", shared=True))
    shared = Shared()
    try:
        first = shared.get(server, 20)
        assert shared.get(server, 20) is first
        pid = json.loads(schemas.result(first.call("whereami", {}, 10))["content"])["pid"]
        with pytest.raises(ServerError, match="exited with code 3"):
            first.call("crash", {}, 10)
        second = shared.get(server, 20)
        assert second is not first and second.alive
        assert json.loads(schemas.result(second.call("whereami", {}, 10))["content"])["pid"] != pid
    finally:
        shared.close()
    assert second.process.poll() is not None


def _in_a_spawned_worker(tool_set, queue) -> None:
    from agentbatch import plugins, run_tools
    from agentbatch.tools import registry

    plugins.load()  # as a worker's start does (processes._worker_main), before the run's MCP tools
    run_tools.install(tool_set)
    tools = registry.load_tools()
    queue.put((tools["raw_whereami"].toolset, tools["raw_whereami"].schema()["function"]["name"]))


def test_a_spawned_worker_registers_the_runs_mcp_tools_without_asking_the_servers():
    """Workers get the tools listed at start in their RunConfig (a Ray actor or a spawned replacement too)."""
    import multiprocessing

    from agentbatch.mcp.tools import McpSetup
    from agentbatch.tool_set import ToolSet

    servers = parse(s=raw("ok", prefix="raw_"))
    setup = McpSetup(servers, listing.list_tools(servers, 20))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    worker = ctx.Process(target=_in_a_spawned_worker, args=(ToolSet(mcp=setup), queue))
    worker.start()
    assert queue.get(timeout=120) == ("s", "raw_whereami")
    worker.join(30)
