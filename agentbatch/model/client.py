"""Every model call of a run, the tools' included: any OpenAI-compatible endpoint, OpenRouter extras, retries.

The agent loop asks through `chat`; tools ask through their context (`ToolContext.ask`, `generate_image`),
which lands here too, so every call gets the same retries, provider routing, usage accounting and
failure reasons.
"""

from __future__ import annotations

import email.utils
import json
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
PROVIDER_SORTS = ("price", "throughput", "latency")
USER_AGENT = "batch-runner"
# The statuses the openai SDK retries besides 5xx: request timeout, conflict (lock timeout), rate limit.
RETRIED_STATUSES = (408, 409, 429)


class ModelCallError(Exception):
    """A model call failed for good (retries exhausted or an error retrying cannot fix)."""


class ContextOverflow(ModelCallError):
    """The conversation no longer fits the model's context window."""


@dataclass
class ModelSettings:
    """Where and how to call the model; the API key never leaves this object except in the request header."""

    model: str
    base_url: str
    api_key: str = field(repr=False)
    request_timeout: float = 600.0
    max_retries: int = 5
    retry_base_delay: float = 1.0
    retry_max_delay: float = 60.0
    providers_allowed: tuple[str, ...] = ()
    providers_ignored: tuple[str, ...] = ()
    providers_order: tuple[str, ...] = ()
    provider_sort: str | None = None
    reasoning_effort: str | None = None
    reasoning_disabled: bool = False
    logprobs: bool = False

    def extra_body(self, main: bool = True) -> dict:
        """OpenRouter's `provider` and (for the main model only) `reasoning` and `logprobs` fields, when asked for."""
        body: dict[str, Any] = {}
        provider = {
            k: v
            for k, v in (
                ("only", list(self.providers_allowed)),
                ("ignore", list(self.providers_ignored)),
                ("order", list(self.providers_order)),
                ("sort", self.provider_sort),
            )
            if v
        }
        if provider:
            body["provider"] = provider
        if not main:
            return body
        if self.logprobs:
            body["logprobs"] = True
        if self.reasoning_disabled:
            body["reasoning"] = {"effort": "none"}
        elif self.reasoning_effort:
            body["reasoning"] = {"enabled": True, "effort": self.reasoning_effort}
        return body


_CONTEXT_WORDS = ("context_length_exceeded", "maximum context length", "context length", "too many tokens")


class ModelClient:
    """One client per process, shared by its threads; each thread POSTs through its own connection pool."""

    def __init__(self, settings: ModelSettings):
        self.settings = settings
        self._ssl = httpx.create_ssl_context()  # loading the CA bundle takes ~25 ms: made once, shared by every pool
        self._pools = threading.local()
        self._base = settings.base_url.rstrip("/")
        self._headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": USER_AGENT}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._rng = random.Random()
        self._lock = threading.Lock()

    def chat(self, messages: list[dict], tools: list[dict] | None = None, model: str | None = None) -> Reply:
        """One chat completion, by default of the run's model; another `model` (a tool's) gets no reasoning fields."""
        s = self.settings
        body: dict[str, Any] = {"model": model or s.model, "messages": messages}
        if tools:
            body["tools"] = tools
        body.update(s.extra_body(main=model is None or model == s.model))
        return self._call("/chat/completions", body, "choices")

    def generate_image(self, request: dict) -> Reply:
        """One images/generations call (OpenAI's images API)."""
        return self._call("/images/generations", request, "data")

    def _call(self, path: str, body: dict, expected: str) -> Reply:
        """POST with retries on 408, 409, 429, 5xx, timeouts, dropped connections and malformed replies."""
        s = self.settings
        attempt = 0
        while True:
            try:
                # Not the openai SDK: its request building (TypedDict walk of every message and tool schema,
                # options, headers) was most of the runner's CPU per prompt, and importing it took ~0.5 s of
                # every worker's start (bench/RESULTS.md).
                return self._post(self._base + path, body, expected)
            except _Status as e:
                if e.status_code == 400:
                    text = f"{e.code} {e.body_text}".lower()
                    if any(w in text for w in _CONTEXT_WORDS):
                        raise ContextOverflow(f"context overflow: {e}") from e
                    raise ModelCallError(f"request rejected: {e}") from e
                if not e.retryable or attempt >= s.max_retries:
                    raise ModelCallError(_after(e, attempt)) from e
                delay = self._delay(attempt, e)
            except _AttemptFailed as e:
                if attempt >= s.max_retries:
                    raise ModelCallError(_after(e, attempt)) from e
                delay = self._delay(attempt, e)
            time.sleep(delay)
            attempt += 1

    def _post(self, url: str, body: dict, expected: str) -> Reply:
        """POST the body with httpx; every failure becomes an _AttemptFailed the retry loop sorts."""
        try:
            r = self._pool().post(url, content=json.dumps(body).encode(), headers=self._headers)
        except httpx.TimeoutException as e:
            raise _AttemptFailed("request timed out") from e
        except httpx.TransportError as e:
            raise _AttemptFailed("connection failed or dropped") from e
        if r.status_code >= 400:
            raise _Status(r)
        try:
            data = r.json()
        except ValueError as e:  # json.JSONDecodeError, or a body that is not UTF-8
            raise _AttemptFailed(f"malformed reply: {str(e)[:200]}") from e
        if not isinstance(data, dict):
            raise _AttemptFailed("malformed reply: reply is not a JSON object")
        if not data.get(expected):
            raise _AttemptFailed(f"malformed reply: reply has no {expected}")
        return Reply(data)

    def _pool(self) -> httpx.Client:
        """This thread's connection pool, made on its first call."""
        # httpcore walks every connection of a pool under its lock on each request and release: one pool shared
        # by 128 threads serialised them, and its CPU per call grew with concurrency (bench/RESULTS.md).
        http = getattr(self._pools, "http", None)
        if http is None:
            http = self._pools.http = httpx.Client(timeout=self.settings.request_timeout, verify=self._ssl)
        return http

    def _delay(self, attempt: int, error: _AttemptFailed) -> float:
        retry_after = _retry_after(error.response) if isinstance(error, _Status) else None
        if retry_after is not None:
            return min(retry_after, self.settings.retry_max_delay)
        with self._lock:
            jitter = self._rng.uniform(0.75, 1.25)
        return min(self.settings.retry_base_delay * 2**attempt, self.settings.retry_max_delay) * jitter


class Reply(dict):
    """The reply's JSON, also read by attribute as the openai types are (`r.choices[0].message`); absent is None.

    Not ChatCompletion.construct: building the pydantic objects took ~0.1 ms a call, about a tenth of a
    worker's CPU per prompt (bench/RESULTS.md), and the loop reads a handful of fields.
    """

    __slots__ = ()

    def __getattr__(self, key: str) -> Any:
        return _readable(self.get(key))


def _readable(value: Any) -> Any:
    if isinstance(value, dict):
        return Reply(value)
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value


class _AttemptFailed(Exception):
    """One attempt failed in a way that retrying may fix; the message is the one-line reason for failed.jsonl."""


class _Status(_AttemptFailed):
    """An HTTP error status. 408, 409, 429 and 5xx are retried; others fail at once (never the request headers)."""

    def __init__(self, response: httpx.Response):
        self.response = response
        self.status_code = response.status_code
        self.body_text = response.text.strip()
        self.code = ""
        message = self.body_text
        try:
            body = json.loads(self.body_text)
        except ValueError:
            body = None
        error = body.get("error", body) if isinstance(body, dict) else None
        if isinstance(error, dict):
            self.code = str(error.get("code") or "")
            message = str(error.get("message") or message)
        elif isinstance(error, str):
            message = error
        self.retryable = self.status_code in RETRIED_STATUSES or self.status_code >= 500
        super().__init__(f"HTTP {self.status_code}: {message[:200]}")


def _after(e: _AttemptFailed, attempt: int) -> str:
    return f"{e} (after {attempt + 1} attempts)" if attempt else str(e)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asked us to wait: retry-after-ms, or Retry-After as seconds or an HTTP date."""
    headers = response.headers
    try:
        if headers.get("retry-after-ms") is not None:
            return max(float(headers["retry-after-ms"]) / 1000, 0.0)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(float(value), 0.0)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max((when - datetime.now(when.tzinfo or UTC)).total_seconds(), 0.0)
    except (TypeError, ValueError, OverflowError):
        return None
