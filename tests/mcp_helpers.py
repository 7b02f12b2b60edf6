"""The MCP servers the tests run: real ones from PyPI and npm, a FastMCP server, and a misbehaving one."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
RAW_SERVER = HERE / "mcp_servers" / "raw_server.py"
FASTMCP_SERVER = HERE / "mcp_servers" / "fastmcp_server.py"
BUSYBOX_SERVER = HERE / "mcp_servers" / "busybox_server.sh"  # for the Docker test images: busybox sh only
FILESYSTEM_SERVER = HERE / "npm" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
# Debian's python: the one a bwrap sandbox sees (the runner's may live below a directory it does not).
SYSTEM_PYTHON = "/usr/bin/python3"


def raw(mode: str = "ok", **extra) -> dict:
    """The standard-library server of tests/mcp_servers/raw_server.py in one of its modes."""
    return {"command": SYSTEM_PYTHON, "args": [str(RAW_SERVER), mode], **extra}


def raw_inline(mode: str = "ok", **extra) -> dict:
    """The same server, its source on the command line: for sandboxes that see no file of the tests."""
    return {"command": SYSTEM_PYTHON, "args": ["-c", RAW_SERVER.read_text(), mode], **extra}


def fastmcp(**extra) -> dict:
    return {"command": sys.executable, "args": [str(FASTMCP_SERVER)], **extra}


def filesystem(*allowed: str, **extra) -> dict:
    """@modelcontextprotocol/server-filesystem under Debian's node (tests/npm; .ci/run installs it)."""
    if not FILESYSTEM_SERVER.exists() or not shutil.which("node"):
        if os.environ.get("BATCH_RUNNER_NO_SKIP"):
            raise AssertionError(f"{FILESYSTEM_SERVER} is missing: npm ci --prefix tests/npm")
        pytest.skip("the npm filesystem server is not installed (npm ci --prefix tests/npm)")
    return {"command": shutil.which("node"), "args": [str(FILESYSTEM_SERVER), *allowed], **extra}


def python_server(module: str, *args: str, **extra) -> dict:
    """A server of a PyPI package, run as `python -m module` by the runner's own interpreter."""
    return {"command": sys.executable, "args": ["-m", module, *args], **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """The FastMCP server over Streamable HTTP (or HTTP+SSE) on a loopback port, for the length of a test."""

    def __init__(self, sse: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/{'sse' if sse else 'mcp'}"
        self.process = subprocess.Popen(
            [sys.executable, str(FASTMCP_SERVER), "--port", str(self.port), *(["--sse"] if sse else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the HTTP MCP server exited: {self.process.stderr.read().decode()[-500:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError("the HTTP MCP server did not listen within 60 s")

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)
