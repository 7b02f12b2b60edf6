"""A stdio MCP server in the standard library alone (it runs under /usr/bin/python3 inside bwrap), misbehaving on request.

argv[1] is the mode: `ok` serves its tools; `hang` never answers its initialization; `invalid_list` lists a
tool whose input schema is not an object; `bad_name` lists a tool whose name endpoints reject; `blank`
writes argv[2] MB of empty lines before it answers its initialization (`blank_forever`: never stops).
Tools: `whereami` (its working directory, pid and the variable MCP_TEST_VALUE), `crash` (exits mid-call),
`stall` (never answers), `shout` (6 MB on stderr, then an answer), `fail` (a result marked isError),
`stringly` (a reply whose result is a string), `chatty` (200,000 log notifications, then its answer).
"""

import json
import os
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "ok"
TOOLS = [
    {"name": "whereami", "description": "Where the server runs.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "crash", "description": "Exit in the middle of the call.", "inputSchema": {"type": "object"}},
    {"name": "stall", "description": "Never answer.", "inputSchema": {"type": "object"}},
    {"name": "shout", "description": "Write a lot to stderr.", "inputSchema": {"type": "object"}},
    {
        "name": "fail",
        "description": "Report a failure.",
        "inputSchema": {"type": "object", "properties": {"why": {"type": "string"}}, "required": ["why"]},
    },
    {"name": "stringly", "description": "Answer with a string for a result.", "inputSchema": {"type": "object"}},
    {"name": "chatty", "description": "Log a lot, then answer.", "inputSchema": {"type": "object"}},
]
NOTIFICATION = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "busy"}}


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(request_id, value, error=False):
    send(
        {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": value}], "isError": error}}
    )


def tools_list():
    if MODE == "invalid_list":
        return [{"name": "broken", "description": "Its schema is a string.", "inputSchema": {"type": "string"}}]
    if MODE == "bad_name":
        return [{"name": "has.dot", "description": "A dotted name.", "inputSchema": {"type": "object"}}]
    return TOOLS


def call(request_id, name, arguments):
    if name == "whereami":
        where = {"cwd": os.getcwd(), "pid": os.getpid(), "value": os.environ.get("MCP_TEST_VALUE", "")}
        text(request_id, json.dumps(where))
    elif name == "crash":
        sys.stderr.write("raw_server: crashing as asked\n")
        sys.stderr.flush()
        os._exit(3)
    elif name == "stall":
        time.sleep(3600)
    elif name == "shout":
        for _ in range(6 * 1024):
            sys.stderr.write("x" * 1023 + "\n")
        sys.stderr.write("raw_server: done shouting\n")
        sys.stderr.flush()
        text(request_id, "shouted")
    elif name == "fail":
        text(request_id, "failed because " + str(arguments.get("why")), error=True)
    elif name == "stringly":
        send({"jsonrpc": "2.0", "id": request_id, "result": "a string"})
    elif name == "chatty":
        sys.stdout.write((json.dumps(NOTIFICATION) + "\n") * 200_000)
        text(request_id, "said a lot")
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32602, "message": "Unknown tool: " + name}})


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue  # a notification
    if method == "initialize":
        if MODE == "hang":
            continue
        if MODE == "blank_forever":
            while True:
                sys.stdout.write("\n" * 1_000_000)
        if MODE == "blank":
            for _ in range(int(sys.argv[2])):
                sys.stdout.write("\n" * 1_000_000)
        info = {"name": "raw", "version": "1"}
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": info}
        send({"jsonrpc": "2.0", "id": request_id, "result": result})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools_list()}})
    elif method == "tools/call":
        params = message.get("params") or {}
        call(request_id, params.get("name"), params.get("arguments") or {})
    else:
        send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
