"""The model-call cache (--cache, docs/replay.md): a call answered from a local store when the same request was
made before, and every reply the endpoint gives stored.

A request's key is a hash of everything that makes its reply: the endpoint (its URL without credentials, or the
name of one whose URL changes between runs: the embedded model's file), the model, the messages, the tools
offered, the sampling settings the request carries (ModelSettings.extra_body: reasoning, max_tokens, routing,
logprobs), and the sample's index and the run's --seed, so the samples of one prompt stay apart
(--samples_per_prompt=4 makes four entries, not one). No credential enters a key or the store.

A cached call costs nothing: its reply comes without `usage`, so neither the line's usage nor the run's budget
counts it, and the line's `usage.cached_calls` counts it instead. The sample's own token and cost limits count
what the reply cost when it was paid for (Usage.add_cached), so a replay stops where the paid run stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import sys
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from agentbatch.model.base import Model, Reply
from agentbatch.model.usage import Usage
from agentbatch.secrets_guard import MIN_SECRET, looks_secret

if TYPE_CHECKING:
    from agentbatch.model.cache_store import Store

KEY_VERSION = 1  # a change to what the key holds makes every old entry a miss, never a wrong reply
EXPIRY_UNITS = {"s": 1, "m": 60, "h": 3600, "D": 86400, "W": 7 * 86400, "M": 30 * 86400, "Y": 365 * 86400}
_EXPIRY = re.compile(r"([1-9][0-9]{0,8})([smhDWMY])")


@dataclass(frozen=True)
class CacheSettings:
    """Where the cache is and how it is used (--cache_dir, --cache_expiry, --cache_size); one per run."""

    directory: str
    expiry: float | None = 7 * 86400.0  # seconds a stored reply is used; None: always
    max_bytes: int = 10 * 1024**3
    seed: int | None = None  # the run's --seed: runs of other seeds are other draws
    # Endpoints whose URL changes from run to run (the embedded model's port), keyed by a name that does not.
    endpoint_names: tuple[tuple[str, str], ...] = ()


def parse_expiry(text: str) -> float | None:
    """Inspect's spelling: a whole number and s, m, h, D, W, M (30 days) or Y (365 days), e.g. 1D or 4W; `never`
    for no expiry. ValueError for anything else."""
    if text == "never":
        return None
    m = _EXPIRY.fullmatch(text)
    if not m:
        raise ValueError(text)
    return float(int(m.group(1)) * EXPIRY_UNITS[m.group(2)])


def endpoint_id(base_url: str, names: tuple[tuple[str, str], ...] = ()) -> str:
    """The endpoint as keys name it: its name if it has one, else its URL without user, password or query
    parameters that look like credentials (`?api_key=...`), its scheme and host in lower case."""
    for url, name in names:
        if url == base_url:
            return name
    parts = urllib.parse.urlsplit(base_url.rstrip("/"))
    host = (parts.hostname or "").lower()
    netloc = f"{host}:{parts.port}" if parts.port else host
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if not looks_secret(k)]
    return urllib.parse.urlunsplit((parts.scheme.lower(), netloc, parts.path, urllib.parse.urlencode(query), ""))


class _Settings(Protocol):
    """What the cache reads of model.client.ModelSettings (not imported: the client imports this module)."""

    model: str
    base_url: str
    api_key: str
    cache: CacheSettings | None

    def extra_body(self, main: bool = True) -> dict: ...


class CachedModel:
    """A model (model.base.Model) whose calls the cache answers when it can; one per worker, shared by its slots.

    Its samples call it through `for_sample`, which puts the sample's index in every key and counts the cached
    calls in the sample's usage.
    """

    def __init__(self, inner: Model, settings: _Settings, store: Store):
        self.inner = inner
        self.settings = settings
        self.store = store
        cache = settings.cache
        assert cache is not None
        self._scope = {"v": KEY_VERSION, "endpoint": endpoint_id(settings.base_url, cache.endpoint_names)}
        self._seed = cache.seed
        self._tools: dict[tuple[int, ...], tuple[list[dict], str]] = {}

    def for_sample(self, sample_index: int, usage: Usage | None) -> Model:
        """This model as one sample calls it: its index in the keys, its cached calls counted in `usage`."""
        return _SampleModel(self, sample_index, usage)

    def for_session(self, session_id: str) -> CachedModel:
        """This cache over its model as one sample's session calls it (client.ModelClient.for_session: the session
        headers, which are no part of a key); the same store."""
        twin = copy.copy(self)
        for_session = getattr(self.inner, "for_session", None)
        twin.inner = for_session(session_id) if for_session is not None else self.inner
        return twin

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        model: str | None = None,
        deadline: float | None = None,
    ) -> Reply:
        return self.call_chat(None, None, messages, tools, model, deadline)

    def generate_image(self, request: dict, deadline: float | None = None) -> Reply:
        return self.call_image(None, None, request, deadline)

    def call_chat(self, sample, usage, messages, tools, model, deadline) -> Reply:
        s = self.settings
        name = model or s.model
        request = {
            "model": name,
            "messages": messages,
            "tools": self._tools_digest(tools),
            "settings": s.extra_body(main=model is None or model == s.model),
        }
        key = self._key("chat", request, sample)
        return self._answer(key, name, "choices", usage, lambda: self.inner.chat(messages, tools, model, deadline))

    def call_image(self, sample, usage, request, deadline) -> Reply:
        key = self._key("images", request, sample)
        name = str(request.get("model") or "")
        return self._answer(key, name, "data", usage, lambda: self.inner.generate_image(request, deadline))

    def _answer(self, key: bytes, model: str, expected: str, usage: Usage | None, call) -> Reply:
        hit = self.store.get(key, expected)
        if hit is not None:
            paid = hit.pop("usage", None)
            if usage is not None:
                usage.add_cached(paid)
            return hit
        reply = call()
        text = json.dumps(reply)
        # A reply that quotes the key (an endpoint echoing its header) is never kept on disk; a key too short to
        # be one (a local server's "x") is no secret to keep out, as for the run's redaction (secrets_guard).
        secret = self.settings.api_key
        if len(secret or "") < MIN_SECRET or secret not in text:
            self.store.put(key, model, text)
        return reply

    def _key(self, kind: str, request: dict, sample: int | None) -> bytes:
        doc = {**self._scope, "kind": kind, "request": request, "sample": sample, "seed": self._seed}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).digest()

    def _tools_digest(self, tools: list[dict] | None) -> str:
        """A hash of the offered schemas, remembered by their identity (the same list goes with every call)."""
        if not tools:
            return ""
        ids = tuple(map(id, tools))
        hit = self._tools.get(ids)
        if hit is None:
            if len(self._tools) > 512:
                self._tools.clear()
            text = json.dumps(tools, sort_keys=True, separators=(",", ":"))
            hit = self._tools[ids] = (list(tools), hashlib.sha256(text.encode()).hexdigest())
        return hit[1]


class _SampleModel:
    """One sample's view of a CachedModel (model.base.Model)."""

    def __init__(self, cached: CachedModel, sample: int, usage: Usage | None):
        self._cached, self._sample, self._usage = cached, sample, usage

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        model: str | None = None,
        deadline: float | None = None,
    ) -> Reply:
        return self._cached.call_chat(self._sample, self._usage, messages, tools, model, deadline)

    def generate_image(self, request: dict, deadline: float | None = None) -> Reply:
        return self._cached.call_image(self._sample, self._usage, request, deadline)


def cached(model: Model, settings: Any) -> Model:
    """`model` behind the cache when the run asked for one (settings.cache), else `model` itself."""
    cache: CacheSettings | None = settings.cache
    if cache is None:
        return model
    from agentbatch.model.cache_store import Store  # sqlite3 only in runs that use a cache

    return CachedModel(model, settings, Store(cache.directory, cache.max_bytes, cache.expiry))


def for_sample(model: Model, sample_index: int, usage: Usage | None) -> Model:
    """The model as one sample calls it: a cached model's view of that sample, any other model itself."""
    return model.for_sample(sample_index, usage) if isinstance(model, CachedModel) else model


def for_run(
    directory: str | None,
    expiry: float | None,
    max_bytes: int,
    seed: int | None,
    base_url: str,
    local_model: str | None = None,
) -> CacheSettings | None:
    """The run's cache settings, its store made ready now, before any model call (FatalError if the directory
    cannot hold one); None, with a warning, for a store that is there but unusable (every call then goes to the
    endpoint). `local_model`: the GGUF file the embedded server at `base_url` serves, which names that endpoint."""
    import sqlite3

    from agentbatch.errors import FatalError
    from agentbatch.model.cache_store import Store, StoreUnusable

    directory = directory or default_directory()
    names = ((base_url, _local_name(local_model)),) if local_model else ()
    settings = CacheSettings(os.path.abspath(directory), expiry, max_bytes, seed, names)
    store = Store(settings.directory, max_bytes, expiry)
    try:
        store.open()
    except StoreUnusable as e:
        print(
            f"warning: the model-call cache {store.path} cannot be used ({e}): this run does not use it; "
            "`batch-runner cache --clear` starts it anew",
            file=sys.stderr,
        )
        return None
    except (OSError, sqlite3.Error) as e:
        raise FatalError(f"--cache_dir {directory} cannot hold the model-call cache: {e}") from None
    finally:
        store.close()
    return settings


def default_directory() -> str:
    """--cache_dir's default: model-calls/ in the user's cache directory (FatalError without a home to find)."""
    from agentbatch.errors import FatalError
    from agentbatch.user_cache import cache_root

    root = cache_root()
    if root is None:
        raise FatalError("no home directory to keep the model-call cache in; give --cache_dir")
    return str(root / "model-calls")


def _local_name(path: str) -> str:
    """The embedded model's endpoint as keys name it: its file, as it is now (another file, or this one replaced,
    is another endpoint)."""
    st = os.stat(path)
    return f"local:{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
