"""Scripted OpenAI-compatible chat-completions server for tests and benchmarks.

Standard library only. Use it in-process::

    with ScriptedServer(script={"hi": [{"content": "hello"}]}) as srv:
        client = OpenAI(base_url=srv.base_url, api_key="x")

or as a separate process::

    python scripted_server.py --port 0 --script script.json --latency 1.0
    # prints "READY http://127.0.0.1:PORT/v1" once listening; SIGTERM stops it.

Script format
-------------
``script`` maps a prompt (the text of the FIRST ``user`` message; list-of-parts
content has its text parts joined with "\\n") to a list of reply specs (a single
spec dict is accepted too). Replies are chosen statelessly: the reply index is
the number of ``assistant`` messages already in the request, and past the end
of the list the last spec is reused. Prompts missing from the script use
``default_script`` (the literal ``{prompt}`` in its ``content`` is replaced by
the prompt); without one the reply is ``{"content": "OK"}``.

Reply spec keys (all optional):

* ``content``: str or null. When neither ``content`` nor ``tool_calls`` is
  given the content is "OK".
* ``tool_calls``: list of ``{"name", "arguments" (str or dict), "id"?}``; ids
  default to ``call_<reply index>_<i>``.
* ``reasoning``, ``reasoning_content``, ``reasoning_details``: copied onto the
  message unchanged.
* ``finish_reason``: default "tool_calls" with tool calls, else "stop".
* ``usage``: dict, default 10 prompt + 5 completion = 15 total tokens.
* ``latency``: seconds, used exactly (no jitter) instead of the server latency.
* ``raw``: a string sent verbatim as the 200 reply body instead of a built
  completion (odd but valid JSON, or not JSON at all).
* ``trickle_seconds``: the reply body is sent one byte at a time, this many
  seconds apart (a server that never stops sending but never finishes).
* ``logprobs``: sent only when the request asks ``logprobs: true``: a list of
  ``[token, logprob]`` pairs, or true for one token per character of the
  content (logprob -0.01 x position). ``token_ids``: a list of ints, or true
  for 1000 + position, put on the choice as vLLM's ``return_token_ids`` does.
* ``token_shape``: how a request with ``return_token_ids: true`` gets its ids:
  "vllm" (default: top-level ``prompt_token_ids``, ``choices[0].token_ids``),
  "sglang" (``choices[0].prompt_token_ids`` and ``response_token_ids``), "sglext"
  (``sglext.input_ids``/``output_ids``), "llama-server" (only ``logprobs.content[].id``)
  or "none". The ids are a toy ChatML, one id per character (scripted_replies.render_prompt);
  ``drift: true`` renders the earlier assistant turns with a leading space.
* ``fault``: "500"/"429"/"400"/any status digits, "context_length", "drop",
  "malformed" or "slow" (``slow_seconds``, default 30, then a normal reply).
  ``fault_times`` (default 1, -1 = always) is how many requests for this
  (prompt, reply index) get the fault before the normal reply is sent.
  ``retry_after`` (default "1") is the 429 ``Retry-After`` header and
  ``error_message`` overrides the error text.

Global faults
-------------
``fault_rates`` such as ``{"500": 0.1, "429": 0.05, "drop": 0.02}`` are drawn
per chat request (one uniform draw from ``random.Random(seed)``) before the
scripted reply is looked at; a global "slow" fault sleeps ``slow_seconds`` and
then carries on. Scripted fault counters only count requests that reach the
script, so a scripted fault is always seen ``fault_times`` times.

Latency
-------
Each normal reply sleeps in its handler thread, so concurrent requests overlap.
Without ``heavy_tail`` the delay is uniform in
``latency * (1 - jitter) .. latency * (1 + jitter)``. With ``heavy_tail`` it is
lognormal with the same mean: ``latency * exp(S * Z - S**2 / 2)``, Z ~ N(0, 1),
S = 1.0 (median ~0.61x, p99 ~6.2x, p99.9 ~13x the mean); ``jitter`` is ignored.

Endpoints
---------
``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /v1/images/generations`` (url or ``b64_json``), ``GET /images/<n>.png``,
``GET /_requests`` and ``GET /_image_requests`` (recorded bodies),
``GET|POST /_faults`` (read or replace the global fault rates),
``GET /_rate`` (what the rate limit accepted and refused).

Rate limit
----------
``rate_limit=R`` (``--rate_limit R``) accepts R chat requests a second and answers 429 beyond that
(scripted_rate_limit.py: a token bucket of ``rate_burst`` requests, by default R, with OpenAI's
x-ratelimit-* and Retry-After headers; ``rate_headers=False`` sends only Retry-After).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import random
import signal
import socket
import sys
import threading

from scripted_handler import Handler, HTTPServer
from scripted_rate_limit import RateLimit
from scripted_replies import (
    MODEL_ID,
    PNG_BYTES,
    prompt_of,
    spec_list,
)

__all__ = ["MODEL_ID", "PNG_BYTES", "ScriptedServer", "main", "prompt_of"]

HEAVY_TAIL_SIGMA = 1.0


class ScriptedServer:
    """An OpenAI-compatible HTTP server with scripted replies, serving from a background thread."""

    def __init__(
        self,
        script: dict | None = None,
        default_script: list | dict | None = None,
        latency: float = 0.0,
        jitter: float = 0.0,
        heavy_tail: bool = False,
        fault_rates: dict | None = None,
        seed: int = 0,
        port: int = 0,
        slow_seconds: float = 30.0,
        host: str = "127.0.0.1",
        rate_limit: float | None = None,
        rate_burst: float | None = None,
        rate_headers: bool = True,
    ):
        self.script = {str(k): spec_list(v, f"script[{k!r}]") for k, v in (script or {}).items()}
        self.default_script = spec_list(default_script, "default_script") if default_script else None
        self.latency = float(latency)
        self.jitter = float(jitter)
        self.heavy_tail = bool(heavy_tail)
        self.slow_seconds = float(slow_seconds)
        self.rate_limit = RateLimit(rate_limit, rate_burst, rate_headers) if rate_limit else None
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._fault_rates: dict[str, float] = {}
        self.set_fault_rates(fault_rates or {})
        self._requests: list[dict] = []
        self._request_headers: list[dict] = []
        self._image_requests: list[dict] = []
        self._fault_counts: dict[tuple[str, int], int] = {}
        self._completion_ids = itertools.count(1)
        self._image_ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self._stopping = threading.Event()
        self._httpd = HTTPServer((host, port), Handler)
        self._httpd.owner = self
        self.host = host
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._thread: threading.Thread | None = None
        self.start()

    # -- lifecycle --------------------------------------------------------

    def start(self) -> ScriptedServer:
        """Start serving (already done by the constructor; idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"ScriptedServer:{self.port}",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake sleeping handlers and close open connections."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- public inspection / control --------------------------------------

    def requests(self) -> list[dict]:
        """Return a copy of every chat request body received so far."""
        with self._lock:
            return copy.deepcopy(self._requests)

    def request_headers(self) -> list[dict]:
        """The headers (lower-case names) of every chat request received so far, in the order of requests()."""
        with self._lock:
            return copy.deepcopy(self._request_headers)

    def image_requests(self) -> list[dict]:
        """Return a copy of every image generation request body received so far."""
        with self._lock:
            return copy.deepcopy(self._image_requests)

    def fault_rates(self) -> dict[str, float]:
        """Return the current global fault rates."""
        with self._lock:
            return dict(self._fault_rates)

    def set_fault_rates(self, rates: dict | None) -> None:
        """Replace the global fault rates, e.g. {"500": 0.1, "drop": 0.02}."""
        clean = {str(k): float(v) for k, v in (rates or {}).items() if float(v) > 0}
        if sum(clean.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to more than 1: {clean}")
        with self._lock:
            self._fault_rates = clean

    def draw_latency(self) -> float:
        """Draw one reply delay from the configured latency distribution."""
        if self.latency <= 0:
            return 0.0
        with self._lock:
            if self.heavy_tail:
                z = self._rng.gauss(0.0, 1.0)
                return self.latency * math.exp(HEAVY_TAIL_SIGMA * z - HEAVY_TAIL_SIGMA**2 / 2)
            if self.jitter <= 0:
                return self.latency
            u = self._rng.uniform(-self.jitter, self.jitter)
        return max(0.0, self.latency * (1 + u))

    # -- used by the handler ----------------------------------------------

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def _record_chat(self, body: dict, headers: dict | None = None) -> None:
        with self._lock:
            self._requests.append(body)
            self._request_headers.append(headers or {})

    def _record_image(self, body: dict) -> None:
        with self._lock:
            self._image_requests.append(body)

    def _spec_for(self, prompt: str, turn: int) -> dict:
        # self.script is read per request so callers may edit it mid-run.
        specs = self.script.get(prompt)
        substitute = False
        if specs is None:
            specs, substitute = self.default_script or [{"content": "OK"}], True
        if isinstance(specs, dict):
            specs = [specs]
        spec = copy.deepcopy(specs[min(turn, len(specs) - 1)])
        if substitute and isinstance(spec.get("content"), str):
            spec["content"] = spec["content"].replace("{prompt}", prompt)
        return spec

    def _roll_fault(self) -> str | None:
        with self._lock:
            if not self._fault_rates:
                return None
            u = self._rng.random()
            acc = 0.0
            for name, rate in self._fault_rates.items():
                acc += rate
                if u < acc:
                    return name
        return None

    def _take_fault(self, key: tuple[str, int], times) -> bool:
        """Count a request for key; True while it is within the first `times`."""
        times = int(times)
        with self._lock:
            seen = self._fault_counts.get(key, 0)
            self._fault_counts[key] = seen + 1
        return times < 0 or seen < times

    def _sleep(self, seconds: float) -> None:
        # Event.wait instead of time.sleep so stop() wakes slow handlers at once.
        if seconds > 0:
            self._stopping.wait(seconds)


def _load_json_file(path: str | None):
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> int:
    """Run the server as a process until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible chat server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--script", help="JSON file: {prompt: [reply spec, ...]}")
    parser.add_argument("--default_script", "--default-script", help="JSON file: [reply spec, ...]")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--heavy_tail", "--heavy-tail", action="store_true")
    parser.add_argument("--fault_rates", "--fault-rates", type=json.loads, default=None)
    parser.add_argument("--slow_seconds", "--slow-seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rate_limit", "--rate-limit", type=float, default=None)
    parser.add_argument("--rate_burst", "--rate-burst", type=float, default=None)
    parser.add_argument("--no_rate_headers", "--no-rate-headers", action="store_true")
    args = parser.parse_args(argv)

    done = threading.Event()

    def _on_signal(signum, frame):
        done.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    srv = ScriptedServer(
        script=_load_json_file(args.script),
        default_script=_load_json_file(args.default_script),
        latency=args.latency,
        jitter=args.jitter,
        heavy_tail=args.heavy_tail,
        fault_rates=args.fault_rates,
        seed=args.seed,
        port=args.port,
        slow_seconds=args.slow_seconds,
        host=args.host,
        rate_limit=args.rate_limit,
        rate_burst=args.rate_burst,
        rate_headers=not args.no_rate_headers,
    )
    print(f"READY {srv.base_url}", flush=True)
    try:
        while not done.wait(0.2):
            pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
