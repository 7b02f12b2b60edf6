"""(14) What a call of an MCP tool costs the runner: a sample's thread handing the call to its worker's MCP loop.

The same calls of the standard-library test server (tests/mcp_servers/raw_server.py) are made three ways:
awaited one after another on the loop itself (the bare SDK: no thread in between), one after another from
a thread as a sample makes them (Connection.call), and from 32 threads at once through one shared
connection. The difference of the first two is the runner's own cost per call.
"""

from __future__ import annotations

import statistics
import threading
import time

from common import ROOT, report

CALLS = 2000


def bench_mcp(results: dict) -> None:
    from agentbatch.mcp import config, host, loop
    from agentbatch.mcp.connection import Connection

    raw = str(ROOT / "tests" / "mcp_servers" / "raw_server.py")
    (server,) = config.parse({"mcpServers": {"raw": {"command": "/usr/bin/python3", "args": [raw]}}}, "bench")
    connection = Connection(server, host.start(server))
    connection.start(30)
    try:
        for _ in range(50):  # warm both paths
            connection.call("whereami", {}, 10)

        async def bare(n: int) -> float:
            session = connection._session
            start = time.perf_counter()
            for _ in range(n):
                await session.call_tool("whereami", {}, read_timeout_seconds=10)
            return time.perf_counter() - start

        bare_runs, thread_runs = [], []
        for _ in range(3):  # interleaved, so a change of the machine's load falls on both
            bare_runs.append(loop.run(bare(CALLS), 300) / CALLS)
            start = time.perf_counter()
            for _ in range(CALLS):
                connection.call("whereami", {}, 10)
            thread_runs.append((time.perf_counter() - start) / CALLS)
        bare_ms, thread_ms = statistics.median(bare_runs) * 1000, statistics.median(thread_runs) * 1000

        threads, per_thread = 32, CALLS // 32

        def caller() -> None:
            for _ in range(per_thread):
                connection.call("whereami", {}, 30)

        start = time.perf_counter()
        workers = [threading.Thread(target=caller) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rate = threads * per_thread / (time.perf_counter() - start)
    finally:
        connection.close()
    results["mcp"] = {"bare_ms": bare_ms, "thread_ms": thread_ms, "concurrent_calls_per_s": rate}
    report(
        results,
        "mcp",
        f"(14) MCP call, stdio server on the host: {bare_ms:.3f} ms awaited on the loop (bare SDK), "
        f"{thread_ms:.3f} ms from a sample's thread (+{thread_ms - bare_ms:.3f} ms); "
        f"{rate:.0f} calls/s from {threads} threads through one connection",
    )


if __name__ == "__main__":
    bench_mcp({})
