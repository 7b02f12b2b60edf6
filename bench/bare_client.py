"""The least any runner can do for bench (10): the same chat requests with nothing else, as a floor.

N prompts, each `--calls` chat requests one after another (every request carries the conversation so far, as
an agent's does), `--concurrency` of them at a time on one asyncio loop, over keep-alive connections made
with the standard library alone. No agent, no tools run, no sandbox, no files written, no workers: what is
left of a run's wall time once everything the runner does is taken away, on the same machine and against
the same endpoint. bench_scale.py runs it beside the runner, so the two ratios are measured together.

    python bench/bare_client.py --base_url http://127.0.0.1:PORT/v1 --prompts 5000 --concurrency 1024
    # prints one JSON line: {"done": N, "calls": N·calls, "answered": N, "failed": 0, "errors": 0}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from urllib.parse import urlsplit


async def session(queue: asyncio.Queue, host: str, port: int, path: str, calls: int, counts: dict) -> None:
    """One connection, kept open, taking the next prompt from the queue until there is none."""
    reader, writer = await asyncio.open_connection(host, port)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    try:
        while not queue.empty():
            prompt = queue.get_nowait()
            messages = [{"role": "user", "content": prompt}]
            for _ in range(calls):
                body = json.dumps({"model": "bench-model", "messages": messages}).encode()
                writer.write(b"%sContent-Length: %d\r\n\r\n%s" % (head.encode(), len(body), body))
                await writer.drain()
                headers = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in headers.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                reply = json.loads(await reader.readexactly(length))
                message = reply["choices"][0]["message"]
                messages.append(message)
                for call in message.get("tool_calls") or []:  # an agent answers each call before asking again
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "bench"})
                counts["calls"] += 1
            counts["done"] += 1
            counts["answered"] += not message.get("tool_calls")  # the script ran to its answer
    finally:
        writer.close()


async def main_async(args) -> dict:
    url = urlsplit(args.base_url)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(args.prompts):
        queue.put_nowait(f"Benchmark task {i}")
    counts = {"done": 0, "calls": 0, "answered": 0}
    path = url.path.rstrip("/") + "/chat/completions"
    sessions = [
        session(queue, url.hostname, url.port, path, args.calls, counts)
        for _ in range(min(args.concurrency, args.prompts))
    ]
    results = await asyncio.gather(*sessions, return_exceptions=True)
    return dict(counts, failed=args.prompts - counts["done"], errors=sum(isinstance(r, Exception) for r in results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base_url", required=True)
    parser.add_argument("--prompts", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--calls", type=int, default=3)
    print(json.dumps(asyncio.run(main_async(parser.parse_args(argv)))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
