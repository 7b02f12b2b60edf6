"""A stdio MCP server's pipes as the two streams the SDK's ClientSession reads and writes.

The SDK's own stdio client starts its process itself; ours is started elsewhere (inside the sample's
sandbox, or on the host for a shared server) as a `Process` of the sandbox interface: blocking binary
stdin and stdout, stderr kept bounded by the process. So the framing is done here: one JSON-RPC message
per line each way, stdout read by a thread of its own and stdin written by another (a server that stops
reading blocks only its own writer), both handing over to the MCP loop. Closing ends the process as the
MCP spec says: stdin closed, a grace period for it to exit, then a kill.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import threading
from collections.abc import AsyncIterator
from typing import BinaryIO, Protocol

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

# The longest line (one message) a server may write; past it the connection is closed as broken.
MAX_MESSAGE = 64 * 1024 * 1024
EXIT_GRACE = 2.0
_CHUNK = 65536


class ServerProcess(Protocol):
    """A started server (sandboxes.base.Process): its pipes, its bounded stderr, its exit code, a kill."""

    stdin: BinaryIO
    stdout: BinaryIO

    def stderr(self) -> str: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class _Lines:
    """Stdout's bytes, split into JSON-RPC messages for the session's read stream (on the MCP loop)."""

    def __init__(self, send: anyio.abc.ObjectSendStream) -> None:
        self.send = send
        self.buffer = bytearray()
        self.ended = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            if line.strip():
                self._deliver(line)
        if len(self.buffer) > MAX_MESSAGE:
            self.buffer.clear()
            self._put(ValueError(f"the server wrote a line of more than {MAX_MESSAGE} bytes"))
            self.end()

    def _deliver(self, line: bytes) -> None:
        try:
            message: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            )
        except ValueError as e:  # not JSON-RPC (a server printing to stdout): the session logs and skips it
            message = e
        self._put(message)

    def _put(self, item: SessionMessage | Exception) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.send.send_nowait(item)

    def end(self) -> None:
        """Stdout ended (or broke): the session sees its connection closed."""
        self.send.close()
        self.ended.set()


def _read(stdout: BinaryIO, loop: asyncio.AbstractEventLoop, lines: _Lines) -> None:
    """The reader thread: stdout's chunks to the loop until it ends."""
    try:
        while data := stdout.read1(_CHUNK):
            loop.call_soon_threadsafe(lines.feed, data)
    except (OSError, ValueError):  # closed under us by a kill
        pass
    finally:
        loop.call_soon_threadsafe(lines.end)


def _write(stdin: BinaryIO, outbox: queue.SimpleQueue) -> None:
    """The writer thread: each line as it comes, then stdin closed (None), so the server reads its end."""
    try:
        while (line := outbox.get()) is not None:
            stdin.write(line)
            stdin.flush()
    except (OSError, ValueError):  # the server is gone; its stdout's end tells the session
        pass
    finally:
        with contextlib.suppress(OSError, ValueError):
            stdin.close()


@contextlib.asynccontextmanager
async def streams(process: ServerProcess) -> AsyncIterator[tuple]:
    """The (read, write) streams of a started process; on exit the process is ended."""
    loop = asyncio.get_running_loop()
    # The dispatcher drains the read stream as messages come; the writes are a few small lines.
    read_send, read_receive = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
    write_send, write_receive = anyio.create_memory_object_stream[SessionMessage](math.inf)
    lines = _Lines(read_send)
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    threads = [
        threading.Thread(target=_read, args=(process.stdout, loop, lines), name="mcp-stdout", daemon=True),
        threading.Thread(target=_write, args=(process.stdin, outbox), name="mcp-stdin", daemon=True),
    ]
    for t in threads:
        t.start()

    async def forward() -> None:
        async for message in write_receive:
            outbox.put(message.message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(forward)
            try:
                yield read_receive, write_send
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            outbox.put(None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lines.ended.wait(), EXIT_GRACE)
            # Whether it exited or not: the kill also ends what it left running, and closes its pipes.
            await asyncio.to_thread(_end, process, threads)
            for stream in (read_send, read_receive, write_send, write_receive):
                stream.close()


def _end(process: ServerProcess, threads: list[threading.Thread]) -> None:
    """Kill the process, then wait a moment for its pipes' threads, which its closed pipes end."""
    process.kill()
    for t in threads:
        t.join(EXIT_GRACE)


def last_line(text: str) -> str:
    """The last non-empty line of a server's stderr, for a one-line error."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""
