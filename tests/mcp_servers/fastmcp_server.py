"""A FastMCP server for the tests: stdio by default, Streamable HTTP on 127.0.0.1 with `--port N` (the older HTTP+SSE
transport with `--sse` too)."""

import os
import sys
import time

from fastmcp import FastMCP

server = FastMCP("tests")


@server.tool
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool
def where() -> dict:
    """The server's working directory, process id and the value of MCP_TEST_VALUE."""
    return {"cwd": os.getcwd(), "pid": os.getpid(), "value": os.environ.get("MCP_TEST_VALUE", "")}


@server.tool
def nap(seconds: float) -> str:
    """Sleep, then say so."""
    time.sleep(seconds)
    return f"slept {seconds} s"


if __name__ == "__main__":
    if "--port" in sys.argv:
        port = int(sys.argv[sys.argv.index("--port") + 1])
        transport = "sse" if "--sse" in sys.argv else "http"
        server.run(transport=transport, host="127.0.0.1", port=port, show_banner=False, log_level="WARNING")
    else:
        server.run(show_banner=False, log_level="WARNING")
