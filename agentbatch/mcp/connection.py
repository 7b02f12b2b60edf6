"""One client session with one MCP server (a started stdio process, or a URL), its methods called from threads.

A task on the process's MCP loop (loop.py) owns the session: it opens the transport, initializes, and
holds both open until close(). The threads of the samples send requests through it; each call waits
at most its timeout. When the server's process ends or its connection drops, every call waiting fails
with why (its exit code and the last line of its stderr), and so does every later call: the caller
decides whether to start another.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import anyio
import httpx2
import mcp_types as types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from agentbatch.mcp import loop, pipes
from agentbatch.mcp.config import ServerConfig

CLIENT = types.Implementation(name="batch-runner", version="1")
# Past a call's own timeout: the loop's answer that it timed out, or the close of a server that hangs.
SLACK = 5.0


class ServerError(Exception):
    """The server cannot be reached or did not answer: the call fails with this one-line reason."""


class Connection:
    """A client session with one server; start() before list_tools() and call(), close() when done."""

    def __init__(self, server: ServerConfig, process: pipes.ServerProcess | None = None):
        self.server = server
        self.process = process
        self._session: ClientSession | None = None
        self._closing: asyncio.Event | None = None
        self._owner: Any = None
        self._ended: str | None = None  # why the connection is gone, once it is

    @property
    def alive(self) -> bool:
        """Whether calls may still be answered: initialized, not closed, its process running."""
        return self._session is not None and self._ended is None and not self._process_ended()

    def start(self, timeout: float) -> None:
        """Open the transport and initialize within `timeout` s; ServerError saying why not."""

        async def begin() -> None:
            self._closing = asyncio.Event()
            started = asyncio.get_running_loop().create_future()
            self._owner = asyncio.ensure_future(self._own(started, timeout))
            await asyncio.shield(started)  # a timeout here leaves the owner to close()

        try:
            loop.run(begin(), timeout + SLACK)
        except TimeoutError:
            self.close()
            raise ServerError(self._why(f"did not answer its initialization in {timeout:g} s")) from None
        except ServerError:
            self.close()
            raise

    async def _own(self, started: asyncio.Future, timeout: float) -> None:
        timed_out = f"did not answer its initialization in {timeout:g} s"
        inner: BaseException | None = None
        try:
            async with self._transport() as (read, write):
                try:
                    async with ClientSession(read, write, client_info=CLIENT) as session:
                        with anyio.fail_after(timeout):
                            await session.initialize()
                        self._session = session
                        started.set_result(None)
                        assert self._closing is not None
                        await self._closing.wait()
                except BaseException as e:  # what failed first, not how the transport then closed
                    inner = e
                    raise
        except BaseException as e:  # the owner's end is every caller's news: never raised out of the loop
            # Described once the transport has ended the process: its exit code is known, no wait on the loop.
            # A transport's own failure (an HTTP connection refused) reaches the session as its cancellation.
            first = e if inner is None or isinstance(inner, asyncio.CancelledError) else inner
            reason = self._failure(first, timed_out, settle=0.0)
            self._ended = self._ended or reason
            if not started.done():
                started.set_exception(ServerError(reason))
                started.exception()  # read here too: nobody may wait for it any more (the start timed out)
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self._session = None
            self._ended = self._ended or "was closed"

    def _transport(self) -> contextlib.AbstractAsyncContextManager:
        if self.server.url and self.server.sse:
            from mcp.client.sse import sse_client

            return sse_client(self.server.url, headers=dict(self.server.headers) or None)
        if self.server.url:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=dict(self.server.headers) or None)
            return streamable_http_client(self.server.url, http_client=client)
        assert self.process is not None, "a stdio connection needs its started process"
        return pipes.streams(self.process)

    def list_tools(self, timeout: float) -> list[types.Tool]:
        """Every tool the server lists (all pages); ServerError if it cannot."""

        async def listing() -> list[types.Tool]:
            tools: list[types.Tool] = []
            cursor = None
            for _ in range(100):  # a paginator that never ends must not hang the start
                page = await self._live().list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                tools += page.tools
                cursor = page.next_cursor
                if not cursor:
                    return tools
            raise ServerError("its tools/list pages never end")

        return self._run(listing(), timeout, "tools/list")

    def call(self, name: str, arguments: dict, timeout: float) -> types.CallToolResult:
        """The server's reply to one tools/call; ServerError when there is none within `timeout` s."""

        async def calling() -> types.CallToolResult:
            return await self._live().call_tool(name, arguments, read_timeout_seconds=timeout)

        return self._run(calling(), timeout, f"the call of {name}")

    def _live(self) -> ClientSession:
        if self._ended is not None or self._session is None:
            raise ServerError(self._ended or "was not started")
        return self._session

    def _run(self, coro: Any, timeout: float, what: str) -> Any:
        try:
            return loop.run(coro, timeout + SLACK)
        except TimeoutError:
            raise ServerError(f"did not answer {what} in {timeout:g} s") from None
        except ServerError:
            raise
        except Exception as e:
            raise ServerError(self._failure(e, f"did not answer {what} in {timeout:g} s")) from None

    def _failure(self, e: BaseException, timed_out: str, settle: float = 0.5) -> str:
        """One line saying why a request (or the whole connection) failed."""
        while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
            e = e.exceptions[0]
        if isinstance(e, TimeoutError):
            return self._why(timed_out)
        if isinstance(e, MCPError):
            if e.code == types.REQUEST_TIMEOUT:
                return self._why(timed_out)
            if e.code == pipes.INVALID_REPLY:  # made by pipes.py of a reply the SDK could not read
                return f"sent a reply that is not valid MCP ({e.message})"
            if e.code == types.CONNECTION_CLOSED:
                self._ended = self._ended or self._why("closed the connection", settle)
                return self._ended
            first = (e.message or "").strip().partition("\n")[0]  # the SDK's own (a parse error's) run on
            return f"answered with error {e.code}: {first[:300]}"
        if isinstance(e, ValidationError):
            first = e.errors()[0] if e.errors() else {}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"sent a reply that is not valid MCP ({where}: {first.get('msg', e)})"
        if isinstance(e, asyncio.CancelledError):
            return self._why("was stopped")
        if isinstance(e, httpx2.HTTPStatusError):
            return f"answered HTTP {e.response.status_code}"
        if isinstance(e, httpx2.TransportError):
            self._ended = self._ended or f"cannot be reached: {e}"
            return self._ended
        if isinstance(e, OSError | anyio.BrokenResourceError | anyio.ClosedResourceError | anyio.EndOfStream):
            self._ended = self._ended or self._why("closed its pipes", settle)
            return self._ended
        return self._why(f"failed: {type(e).__name__}: {e}")

    def _why(self, what: str, settle: float | None = None) -> str:
        """What happened, the last line of its stderr, and the process's exit code if it ended (`settle` given)."""
        code = None if settle is None else self._exit_code(settle)
        if code is not None:
            what = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
        line = pipes.last_line(self.process.stderr()) if self.process is not None else ""
        return f"{what} (stderr: {line})" if line else what

    def _exit_code(self, settle: float) -> int | None:
        """The process's exit code, waiting up to `settle` s: its pipes close a moment before it is seen to end."""
        if self.process is None:
            return None
        deadline = time.monotonic() + settle
        while (code := self.process.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return code

    def _process_ended(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def close(self) -> None:
        """End the session and the server's process (stdin closed, then a kill); never raises."""
        owner, closing = self._owner, self._closing
        if owner is None or closing is None:
            if self.process is not None:
                with contextlib.suppress(Exception):
                    self.process.kill()
            return

        async def finish() -> None:
            closing.set()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(owner), pipes.EXIT_GRACE + SLACK)
            if not owner.done():
                owner.cancel()

        with contextlib.suppress(Exception):
            loop.run(finish(), pipes.EXIT_GRACE + 2 * SLACK)
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(Exception):
                self.process.kill()
