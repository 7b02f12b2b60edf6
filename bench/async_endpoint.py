"""The scripted endpoint of the scale benchmarks: tests/scripted_server.py's replies, served by one asyncio loop.

The test server gives every connection a thread and spends ~1.3 ms of CPU on a chat request on the 2-core
machine of bench/RESULTS.md (the runner spends ~0.8 ms): at 1,024 samples in flight it would hold 1,024 threads
and need most of a core for itself, on the same two cores as the runner it measures. A real endpoint's
CPU is not on the runner's machine, so the scale figures use this one: the same reply for the same request
(its default script through scripted_replies.build_message, the same envelope), the same latency draw
(uniform within --jitter of --latency, from --seed), at ~0.2 ms of CPU per request.
It also notes the time of the first request and of the last reply (time.monotonic, the same clock in
every process of the machine), so a benchmark can tell the runner's fixed overhead from the run itself.
With --rate_limit it is the rate-limited endpoint of tests/scripted_rate_limit.py (a 429 answered at once),
at a few hundred requests a second that the threaded test server could not serve beside the runner.

    python bench/async_endpoint.py --port 0 --default_script script.json --latency 1.0 --jitter 0.2
    # prints "READY http://127.0.0.1:PORT/v1"; GET /_timings, GET /_rate; SIGTERM stops it.
    python bench/async_endpoint.py ... --rate_limit 50 --rate_window --rate_headers retry-after \
        --rate_schedule 0:200,10:50,30:200
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from scripted_rate_limit import RateLimit  # noqa: E402
from scripted_replies import DEFAULT_USAGE, MODEL_ID, build_message, prompt_of, spec_list  # noqa: E402

RATE_HEADERS = ("openai", "retry-after", "none")  # what a 429 says: x-ratelimit-* and Retry-After, Retry-After, nothing


class Endpoint:
    """The default script's replies with latency; counts requests and notes the first and last."""

    def __init__(
        self, default_script: list[dict], latency: float, jitter: float, seed: int, rate_limit: RateLimit | None = None
    ):
        self.rate_limit = rate_limit
        self.script = spec_list(default_script, "default_script")
        self.latency, self.jitter = latency, jitter
        self.rng = random.Random(seed)
        self.ids = itertools.count(1)
        self.requests = 0
        self.first_request: float | None = None
        self.last_reply: float | None = None
        self.in_flight = 0
        self.peak_in_flight = 0
        self.spans: list[tuple[float, float]] = []  # (start, end) of each answered request
        self.replied: dict[str, float] = {}  # each prompt's last reply (time.monotonic)
        self.gaps: list[float] = []  # from a prompt's reply to its next request: the runner's time between calls

    def delay(self) -> float:
        if self.latency <= 0:
            return 0.0
        if self.jitter <= 0:
            return self.latency
        return max(0.0, self.latency * (1 + self.rng.uniform(-self.jitter, self.jitter)))

    def reply(self, body: dict) -> dict:
        """What scripted_server sends for this chat request under its default script."""
        prompt = prompt_of(body)
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        spec = copy.deepcopy(self.script[min(turn, len(self.script) - 1)])
        if isinstance(spec.get("content"), str):
            spec["content"] = spec["content"].replace("{prompt}", prompt)
        msg, finish = build_message(spec, turn)
        return {
            "id": f"chatcmpl-scripted-{next(self.ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or MODEL_ID,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
            "usage": spec.get("usage") or dict(DEFAULT_USAGE),
            "system_fingerprint": None,
        }

    def timings(self) -> dict:
        return {
            "requests": self.requests,
            "first_request": self.first_request,
            "last_reply": self.last_reply,
            "peak_in_flight": self.peak_in_flight,
            "in_flight_trace": self.trace(),
            "first_second_trace": self.trace(0.05)[:20],
            "gaps": self.gaps,
        }

    def trace(self, step: float = 0.5) -> list[float]:
        """Mean requests in flight in each `step` seconds from the first request: where a run loses time."""
        if not self.spans or self.first_request is None:
            return []
        origin = self.first_request
        buckets = [0.0] * (int((max(e for _, e in self.spans) - origin) / step) + 1)
        for start, end in self.spans:
            a, b = start - origin, end - origin
            i = int(a / step)
            while a < b:
                edge = min(b, (i + 1) * step)
                buckets[i] += edge - a
                a, i = edge, i + 1
        return [round(x / step, 1) for x in buckets]

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One keep-alive connection: requests in order, each answered after its latency."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                request_line, _, header_text = head.decode("latin-1").partition("\r\n")
                method, path = (request_line.split(" ") + ["", ""])[:2]
                length = 0
                for line in header_text.split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                raw = await reader.readexactly(length) if length else b""
                if method == "GET" and path == "/_timings":
                    await _send(writer, 200, self.timings())
                    continue
                if method == "GET" and path == "/_rate":
                    await _send(writer, 200, self.rate_limit.stats() if self.rate_limit else {})
                    continue
                if method != "POST" or not path.rstrip("/").endswith("/chat/completions"):
                    await _send(writer, 404, {"error": {"message": f"no route {method} {path}"}})
                    continue
                now = time.monotonic()
                self.requests += 1
                self.first_request = self.first_request or now
                if self.rate_limit is not None:
                    accepted, headers = self.rate_limit.take()
                    if not accepted:  # answered at once: no tokens are generated for a refusal
                        error = {"message": "Rate limit reached for requests.", "code": "rate_limit_exceeded"}
                        await _send(writer, 429, {"error": error}, headers)
                        continue
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                try:
                    body = json.loads(raw)
                    prompt = prompt_of(body)
                    if prompt in self.replied:
                        self.gaps.append(now - self.replied[prompt])
                    answer = self.reply(body)
                    await asyncio.sleep(self.delay())
                    await _send(writer, 200, answer)
                finally:
                    self.in_flight -= 1
                self.last_reply = time.monotonic()
                self.replied[prompt] = self.last_reply
                self.spans.append((now, self.last_reply))
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()


async def _send(writer: asyncio.StreamWriter, status: int, obj, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(obj).encode()
    reason = {200: "OK", 429: "Too Many Requests"}.get(status, "Not Found")
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    writer.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s"
        % (status, reason.encode(), extra, len(body), body)
    )
    await writer.drain()


async def main_async(args) -> None:
    script = json.loads(Path(args.default_script).read_text()) if args.default_script else [{"content": "OK"}]
    limit = None
    if args.rate_limit:
        schedule = (
            [tuple(map(float, part.split(":"))) for part in args.rate_schedule.split(",")]
            if args.rate_schedule
            else None
        )
        limit = RateLimit(
            args.rate_limit,
            headers=args.rate_headers == "openai",
            window=args.rate_window,
            retry_after=args.rate_headers != "none",
            schedule=schedule,
        )
    endpoint = Endpoint(script, args.latency, args.jitter, args.seed, limit)
    server = await asyncio.start_server(endpoint.serve, args.host, args.port, backlog=4096, reuse_address=True)
    port = server.sockets[0].getsockname()[1]
    print(f"READY http://{args.host}:{port}/v1", flush=True)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    async with server:
        await done.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--default_script", help="JSON file: [reply spec, ...]")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate_limit", type=float, default=None, help="requests a second; 429 beyond")
    parser.add_argument("--rate_window", action="store_true", help="a sliding one-second window, not a token bucket")
    parser.add_argument("--rate_headers", choices=RATE_HEADERS, default="openai")
    parser.add_argument("--rate_schedule", help="the limit moving: SECONDS:RATE,... from the first request")
    asyncio.run(main_async(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
