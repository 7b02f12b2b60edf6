"""Every model call of a run, the tools' included: any OpenAI-compatible endpoint, OpenRouter extras, retries.

The agent loop asks through `chat`; tools ask through their context (`ToolContext.ask`, `generate_image`),
which lands here too, so every call gets the same retries, provider routing, usage accounting and
failure reasons.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from agentbatch.model import token_ids, transport
from agentbatch.model.base import ContextOverflow, DeadlineReached, ModelCallError, Reply
from agentbatch.model.pacing_peers import Peers
from agentbatch.model.rate_limit import Pacer
from agentbatch.model.rate_limit import retry_after as _retry_after
from agentbatch.secrets_guard import Redactor
from agentbatch.surrogates import has_escaped_surrogate, scrub_json

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
PROVIDER_SORTS = ("price", "throughput", "latency")
USER_AGENT = "batch-runner"
# The statuses the openai SDK retries besides 5xx: request timeout, conflict (lock timeout), rate limit.
RETRIED_STATUSES = (408, 409, 429)
# A reply is one assistant message: even 100k tokens of reasoning and a large file written in a tool call are
# a few MB. Past these it is a runaway reply, refused before it takes a worker's memory, and retried.
MAX_REPLY_BYTES = 8 * 1024 * 1024
MAX_TOOL_CALLS = 128


@dataclass(frozen=True)
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
    max_tokens: int | None = None  # per call (--max_tokens), sent as the request's max_tokens
    workers: int = 1  # processes calling the endpoint at once, each pacing its share of its rate limit
    pacing: bool = True  # False sends every call at once, as the runner did before (the benchmarks' baseline)
    pacing_dir: str | None = None  # where the workers tell each other an endpoint's rate limit (rate_limit.py)
    logprobs: bool = False
    token_ids: bool = False  # ask every call of the main model for its token ids (model/token_ids.py)
    tokenizer: str | None = None  # whose chat template retokenizes an endpoint's calls that come without ids
    policy_version: str | None = None  # the label of the policy the endpoint serves, recorded on every call

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
        if self.max_tokens:
            body["max_tokens"] = self.max_tokens
        if reports_cost(self.base_url):
            # OpenRouter's usage accounting: the call's cost in `usage.cost`. Only there: api.openai.com
            # rejects unknown request fields.
            body["usage"] = {"include": True}
        if not main:
            return body
        if self.logprobs:
            body["logprobs"] = True
        if self.token_ids:
            body.update(token_ids.REQUEST_FIELDS)
        if self.reasoning_disabled:
            body["reasoning"] = {"effort": "none"}
        elif self.reasoning_effort:
            body["reasoning"] = {"enabled": True, "effort": self.reasoning_effort}
        return body


_CONTEXT_WORDS = ("context_length_exceeded", "maximum context length", "context length", "too many tokens")


class ModelClient:
    """The HTTP model (model.base.Model): one client per process, shared by its threads; each thread POSTs through its own keep-alive connection."""

    def __init__(self, settings: ModelSettings):
        self.settings = settings
        self._origin = transport.Origin.of(settings.base_url)
        self._proxied = transport.proxied(settings.base_url)
        self._tls = None  # loading the CA bundle takes ~25 ms: made on the first https call, shared by every thread
        self._connections = threading.local()
        self._headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._encoded: dict[tuple[int, ...], tuple[list[dict], str]] = {}
        # An endpoint may echo the Authorization header in an error body: the key is cut out before anything.
        self._redact = Redactor([settings.api_key])
        # This process's share of the endpoint's rate limit: the worker processes each pace their own calls.
        self.pacer = Pacer(
            share=1 / max(1, settings.workers),
            enabled=settings.pacing,
            peers=Peers(settings.pacing_dir, settings.base_url.rstrip("/")),
        )

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        model: str | None = None,
        deadline: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """One chat completion, by default of the run's model; another `model` (a tool's) gets no reasoning fields.

        `deadline` (time.monotonic) is the prompt's time limit: the call is cut there (DeadlineReached);
        `headers` go with this request alone (a sample's session headers: `for_session`).
        """
        s = self.settings
        body: dict[str, Any] = {"model": model or s.model, "messages": messages}
        body.update(s.extra_body(main=model is None or model == s.model))
        return self._call("/chat/completions", body, "choices", tools, _check_chat, deadline, headers)

    def generate_image(self, request: dict, deadline: float | None = None, headers: dict | None = None) -> Reply:
        """One images/generations call (OpenAI's images API), cut at `deadline` as `chat`'s is."""
        return self._call("/images/generations", request, "data", deadline=deadline, headers=headers)

    def for_session(self, session_id: str) -> SessionClient:
        """This client with the session headers of one sample on every call (session_headers)."""
        return SessionClient(self, session_headers(session_id))

    def _call(
        self,
        path: str,
        body: dict,
        expected: str,
        tools: list[dict] | None = None,
        check=None,
        deadline: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """POST with retries on 408, 409, 429, 5xx, timeouts, dropped connections and malformed replies."""
        s = self.settings
        content = json.dumps(body)
        if tools:  # the same schemas go with every call of a prompt: encoded once per set, not per call
            content = f'{content[:-1]}, "tools": {self._tools_json(tools)}}}'
        content = content.encode()
        attempt = 0
        while True:
            try:
                # Not the openai SDK: its request building (TypedDict walk of every message and tool schema,
                # options, headers) was most of the runner's CPU per prompt, and importing it took ~0.5 s of
                # every worker's start (bench/RESULTS.md).
                return self._post(path, content, expected, check, deadline, headers)
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
                if deadline is not None and time.monotonic() >= deadline:
                    raise DeadlineReached(f"the prompt's time limit cut the model call ({e})") from e
                if attempt >= s.max_retries:
                    raise ModelCallError(_after(e, attempt)) from e
                delay = self._delay(attempt, e)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise DeadlineReached("the prompt's time limit comes before the model call could be retried")
            time.sleep(delay)
            attempt += 1

    def _post(
        self, path: str, content: bytes, expected: str, check, deadline: float | None, headers: dict | None = None
    ) -> Reply:
        """POST the JSON body when the pacer says so; every failure becomes an _AttemptFailed the retry loop sorts.

        The whole call, connecting to the last byte, ends within --request_timeout and by the prompt's
        `deadline`, and a reply over MAX_REPLY_BYTES is refused as it streams in (transport).
        """
        ticket = self.pacer.acquire(deadline)
        ends = time.monotonic() + self.settings.request_timeout
        if ticket is not None and deadline is not None:
            ends = min(ends, deadline)
        if ticket is None or ends <= time.monotonic():
            if ticket is not None:
                self.pacer.release(ticket, 0, None)
            raise DeadlineReached("the prompt's time limit was reached before the model answered")
        status, reply_headers = 0, None
        try:
            r = self._connection().post(path, content, ends, MAX_REPLY_BYTES, headers)
            status, reply_headers = r.status_code, r.headers
        except transport.BadReply as e:  # too big, or a body its Content-Encoding cannot decode
            raise _AttemptFailed(f"malformed reply: {e}") from e
        except transport.TransportError as e:
            raise _AttemptFailed(str(e)) from e
        finally:
            self.pacer.release(ticket, status, reply_headers)
        if r.status_code >= 400:
            raise _Status(r, self._redact)
        try:
            data = _REPLY_DECODER.decode(r.content.decode(json.detect_encoding(r.content)))
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested past any sane depth
            raise _AttemptFailed(f"malformed reply: {_short(e)}") from e
        if not isinstance(data, dict):
            raise _AttemptFailed("malformed reply: reply is not a JSON object")
        if not data.get(expected):
            raise _AttemptFailed(f"malformed reply: reply has no {expected}")
        if has_escaped_surrogate(r.content):
            scrub_json(data)
        if check is not None:
            check(data)
        return data

    def _tools_json(self, tools: list[dict]) -> str:
        """The JSON of a list of tool schemas, remembered by the identity of its schemas (the registry's own)."""
        key = tuple(map(id, tools))
        hit = self._encoded.get(key)
        if hit is None:
            if len(self._encoded) > 512:  # schemas made per call (not the registry's) must not pile up
                self._encoded.clear()
            # The list itself is kept, so the ids in the key stay those of these schemas.
            hit = self._encoded[key] = (list(tools), json.dumps(tools))
        return hit[1]

    def _connection(self) -> transport.Connection | transport.ProxiedConnection:
        """This thread's connection, made on its first call."""
        # One per thread, not a shared pool: a pool shared by 128 threads serialised them on its lock, and
        # its CPU per call grew with concurrency (bench/RESULTS.md).
        conn = getattr(self._connections, "conn", None)
        if conn is None:
            timeout = self.settings.request_timeout
            if self._proxied:
                conn = transport.ProxiedConnection(self._origin, self._headers, timeout)
            else:
                if self._origin.scheme == "https" and self._tls is None:
                    with self._lock:
                        self._tls = self._tls or transport.ssl_context()
                conn = transport.Connection(self._origin, self._headers, timeout, self._tls)
            self._connections.conn = conn
        return conn

    def _delay(self, attempt: int, error: _AttemptFailed) -> float:
        retry_after = _retry_after(error.response.headers) if isinstance(error, _Status) else None
        if retry_after is not None:
            return min(retry_after, self.settings.retry_max_delay)
        with self._lock:
            jitter = self._rng.uniform(0.75, 1.25)
        return min(self.settings.retry_base_delay * 2**attempt, self.settings.retry_max_delay) * jitter


def session_headers(session_id: str) -> dict[str, str]:
    """The headers that keep one sample's calls on one replica (its prefix cache), for the routers that read them.

    `X-Session-ID`: vLLM, vLLM's router, LiteLLM (8+ characters of [A-Za-z0-9_-]), NVIDIA Dynamo;
    `X-SMG-Routing-Key`: SGLang's router. Headers only: body fields such as `user` change what providers log.
    """
    return {"X-Session-ID": session_id, "X-SMG-Routing-Key": session_id}


class SessionClient:
    """A ModelClient seen by one sample: the same connections, its session headers on every call."""

    def __init__(self, client: ModelClient, headers: dict[str, str]):
        self.client = client
        self.settings = client.settings
        self.headers = headers

    def chat(self, messages, tools=None, model=None, deadline=None) -> Reply:
        return self.client.chat(messages, tools, model, deadline, self.headers)

    def generate_image(self, request: dict, deadline: float | None = None) -> Reply:
        return self.client.generate_image(request, deadline, self.headers)


# One decoder for every reply (json.loads with an object_hook builds a new one per call).
_REPLY_DECODER = json.JSONDecoder(object_hook=Reply)


class _AttemptFailed(Exception):
    """One attempt failed in a way that retrying may fix; the message is the one-line reason for failed.jsonl."""


class _Status(_AttemptFailed):
    """An HTTP error status. 408, 409, 429 and 5xx are retried; others fail at once (never the request headers)."""

    def __init__(self, response: transport.Response, redact: Redactor):
        self.response = response
        self.status_code = response.status_code
        # Redacted before it is cut: a cut first could leave a prefix of the key that redaction misses.
        self.body_text = redact(response.text.strip())
        self.code = ""
        message = self.body_text
        try:
            body = json.loads(self.body_text)
        except (ValueError, RecursionError):
            body = None
        error = body.get("error", body) if isinstance(body, dict) else None
        if isinstance(error, dict):
            self.code = str(error.get("code") or "")
            message = str(error.get("message") or message)
        elif isinstance(error, str):
            message = error
        self.retryable = self.status_code in RETRIED_STATUSES or self.status_code >= 500
        super().__init__(f"HTTP {self.status_code}: {message[:200]}")


def _short(e: Exception) -> str:
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]


def _check_chat(data: dict) -> None:
    """Check (and normalise in place) the fields the agent loop reads; raise _AttemptFailed when one is unusable.

    Odd but harmless forms are normalised as before: content as a list of text parts, arguments as an
    object, a missing or numeric call id. Anything else would fail the prompt after its tokens were spent,
    so it counts as a malformed reply and is retried.
    """
    choices = data["choices"]
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _AttemptFailed("malformed reply: choices is not a list of objects")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _AttemptFailed("malformed reply: the choice has no message object")
    if not isinstance(choices[0].get("finish_reason"), str | None):
        choices[0]["finish_reason"] = None
    content = message.get("content")
    if isinstance(content, list):
        message["content"] = "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    elif not isinstance(content, str | None):
        raise _AttemptFailed(f"malformed reply: content is a {type(content).__name__}")
    calls = message.get("tool_calls")
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _AttemptFailed("malformed reply: tool_calls is not a list")
    if len(calls) > MAX_TOOL_CALLS:
        raise _AttemptFailed(f"malformed reply: {len(calls)} tool calls, over the limit of {MAX_TOOL_CALLS} a reply")
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _AttemptFailed("malformed reply: a tool call without a function name")
        if isinstance(call.get("id"), int) and not isinstance(call["id"], bool):
            call["id"] = str(call["id"])
        elif not isinstance(call.get("id"), str | None):
            raise _AttemptFailed(f"malformed reply: a tool call id is a {type(call['id']).__name__}")
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            try:
                function["arguments"] = json.dumps(arguments, ensure_ascii=False)
            except (ValueError, TypeError, RecursionError) as e:
                raise _AttemptFailed(f"malformed reply: tool call arguments: {_short(e)}") from e


@functools.lru_cache(maxsize=64)  # asked on every call; parsing the URL each time was ~0.05 ms of it
def reports_cost(base_url: str) -> bool:
    """Whether the endpoint reports each call's cost (OpenRouter's usage accounting)."""
    host = urllib.parse.urlsplit(base_url).hostname or ""
    return host == "openrouter.ai" or host.endswith(".openrouter.ai")


def _after(e: _AttemptFailed, attempt: int) -> str:
    return f"{e} (after {attempt + 1} attempts)" if attempt else str(e)
