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
import json
import math
import queue
import re
import threading
from collections.abc import AsyncIterator
from typing import BinaryIO, Protocol

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

# The longest line (one message) a server may write; past it the connection is closed as broken.
MAX_MESSAGE = 64 * 1024 * 1024
EXIT_GRACE = 2.0
# The code of the error a reply that is not valid JSON-RPC becomes (connection.py says what it means).
INVALID_REPLY = -32099
_CHUNK = 65536
_CONTENT = re.compile(rb"\S")


class ServerProcess(Protocol):
    """A started server (sandboxes.base.Process): its pipes, its bounded stderr, its exit code, a kill."""

    stdin: BinaryIO
    stdout: BinaryIO

    def stderr(self) -> str: ...

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...


class _Lines:
    """Stdout's bytes, split into JSON-RPC messages for the session's read stream (on the MCP loop).

    Blank lines are skipped and notifications dropped at C speed, before any validation: this client asks
    for none (log messages, progress), and a server flooding them must not keep its answer from being read
    in time. A reply that is no valid JSON-RPC response still answers its request, as an error that says so.
    """

    def __init__(self, send: anyio.abc.ObjectSendStream) -> None:
        self.send = send
        self.buffer = bytearray()  # the start of a line whose end has not come yet (it starts with content)
        self.ended = asyncio.Event()

    def feed(self, data: bytes) -> None:
        known = len(self.buffer)  # no newline in these
        self.buffer += data
        buffer, pos = self.buffer, 0
        while True:
            if known:
                start = 0
            else:
                found = _CONTENT.search(buffer, pos)
                start = found.start() if found else len(buffer)
            end = buffer.find(b"\n", start + known) if start < len(buffer) else -1
            known = 0
            if end < 0:
                pos = start
                break
            self._deliver(bytes(buffer[start:end]))
            pos = end + 1
        del buffer[:pos]
        if len(buffer) > MAX_MESSAGE:
            buffer.clear()
            self._put(ValueError(f"the server wrote a line of more than {MAX_MESSAGE} bytes"))
            self.end()

    def _deliver(self, line: bytes) -> None:
        try:
            data = json.loads(line)
        except (ValueError, RecursionError) as e:  # not JSON (a server printing to stdout): the session logs, skips
            self._put(ValueError(f"not JSON: {e}"))
            return
        if isinstance(data, dict) and "method" in data and "id" not in data:
            return  # a notification
        try:
            message: SessionMessage | Exception = SessionMessage(
                types.jsonrpc_message_adapter.validate_python(data, by_name=False)
            )
        except ValidationError as e:
            message = _invalid_reply(data, e) or e
        self._put(message)

    def _put(self, item: SessionMessage | Exception) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self.send.send_nowait(item)

    def end(self) -> None:
        """Stdout ended (or broke): the session sees its connection closed."""
        self.send.close()
        self.ended.set()


def _invalid_reply(data: object, e: ValidationError) -> SessionMessage | None:
    """A response that is not valid JSON-RPC (its `result` a string, say) as an error answering its request,
    so the caller learns what came instead of waiting for its timeout; None if it names no request."""
    if not isinstance(data, dict) or not ("result" in data or "error" in data):
        return None
    request_id = data.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    kind = "JSONRPCResponse" if "result" in data else "JSONRPCError"
    errors = [err for err in e.errors() if err["loc"][:1] == (kind,)] or e.errors()
    first = errors[0] if errors else {"loc": (), "msg": str(e)}
    where = ".".join(str(p) for p in first["loc"][1:] if first["loc"][:1] == (kind,)) or "reply"
    error = types.ErrorData(code=INVALID_REPLY, message=f"{where}: {first['msg']}")
    return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


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
