"""A stdio MCP server's pipes as the two streams the SDK's ClientSession reads and writes.

The SDK's own stdio client starts its process itself; ours is started elsewhere (inside the sample's
sandbox, or on the host for a shared server), so the framing is done here, over any process with the
pipes of a `subprocess.Popen`: one JSON-RPC message per line each way, stderr kept to its last
STDERR_TAIL bytes (read all the time, so a chatty server never blocks on a full pipe). Closing ends the
process as the MCP spec says: stdin closed, a grace period, then a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from typing import IO, Protocol

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

STDERR_TAIL = 16 * 1024
# The longest line (one message) a server may write; past it the connection is closed as broken.
MAX_MESSAGE = 64 * 1024 * 1024
EXIT_GRACE = 2.0


class ServerProcess(Protocol):
    """A started server: its three pipes, its exit code when it has ended, and a kill of all it started."""

    stdin: IO[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes] | None

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class Stderr(asyncio.Protocol):
    """The last STDERR_TAIL bytes a server wrote to stderr."""

    def __init__(self) -> None:
        self.data = bytearray()

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) > STDERR_TAIL:
            del self.data[: len(self.data) - STDERR_TAIL]

    def last_line(self) -> str:
        """The last non-empty line, for a one-line error."""
        lines = [ln.strip() for ln in self.data.decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""


class _Lines(asyncio.Protocol):
    """Stdout, one JSON-RPC message per line, into the session's read stream; its end closes the stream."""

    def __init__(self, send: anyio.abc.ObjectSendStream) -> None:
        self.send = send
        self.buffer = bytearray()
        self.transport: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            if line.strip():
                self._deliver(line)
        if len(self.buffer) > MAX_MESSAGE and self.transport is not None:
            self.buffer.clear()
            self._deliver_error(ValueError(f"the server wrote a line of more than {MAX_MESSAGE} bytes"))
            self.transport.close()

    def _deliver(self, line: bytes) -> None:
        try:
            message: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as e:  # not JSON-RPC (a server printing to stdout): the session logs and skips it
            message = e
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.send.send_nowait(message)

    def _deliver_error(self, error: Exception) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.send.send_nowait(error)

    def eof_received(self) -> bool:
        self.send.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.send.close()


@contextlib.asynccontextmanager
async def streams(process: ServerProcess, stderr: Stderr) -> AsyncIterator[tuple]:
    """The (read, write) streams of a started process; on exit the process is ended."""
    loop = asyncio.get_running_loop()
    # The dispatcher drains the read stream as messages come; the writes are a few small lines.
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](math.inf)
    transports: list[asyncio.BaseTransport] = []
    try:
        out, _ = await loop.connect_read_pipe(lambda: _Lines(read_send), process.stdout)
        transports.append(out)
        if process.stderr is not None:
            err, _ = await loop.connect_read_pipe(lambda: stderr, process.stderr)
            transports.append(err)
        stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, process.stdin)
        transports.append(stdin)

        async def write() -> None:
            async for message in write_receive:
                if stdin.is_closing():
                    return
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                stdin.write(line.encode())

        async with anyio.create_task_group() as tg:
            tg.start_soon(write)
            try:
                yield read_receive, write_send
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await end(process, transports)
            for stream in (read_send, read_receive, write_send, write_receive):
                stream.close()


async def end(process: ServerProcess, transports: list[asyncio.BaseTransport]) -> None:
    """Close stdin, give the server EXIT_GRACE s to exit, then kill it; close our ends of its pipes."""
    for t in transports:
        if isinstance(t, asyncio.WriteTransport):
            t.close()
    deadline = asyncio.get_running_loop().time() + EXIT_GRACE
    while process.poll() is None and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
    if process.poll() is None:
        process.kill()
    for t in transports:
        t.close()
