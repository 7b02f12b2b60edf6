"""Everything the tools are configured by, flags and environment alike, read once when a run starts.

A tool reads its settings from `ctx.settings`, never from the environment: credentials were withdrawn
from it (secrets_guard) and travel to the workers inside this object, and a setting that cannot be read
(`WEB_TIMEOUT=3O`, `WEB_SEARCH_BACKEND=tavly`) stops the run at start instead of failing every call.
docs/toolsets.md lists the variables.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from agentbatch.errors import FatalError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Search services in the order one is picked when several are configured, with the variable enabling each.
SEARCH_BACKENDS = {"tavily": "TAVILY_API_KEY", "brave": "BRAVE_API_KEY", "searxng": "SEARXNG_URL"}
PRIVATE_URLS_VAR = "BATCH_RUNNER_ALLOW_PRIVATE_URLS"
_TRUE = {"1", "true", "yes", "on", "all"}
_WEEK = 7 * 24 * 3600.0
_GIB = 1 << 30
_FALSE = {"", "0", "false", "no", "off", "none"}


@dataclass(frozen=True)
class ToolSettings:
    """The tools' settings. `private_networks` None lets the web tools reach every address."""

    command_timeout: float = 60.0
    request_timeout: float = 120.0
    max_output_chars: int = 20_000
    private_networks: tuple[Network, ...] | None = ()
    vision_model: str | None = None
    vision_max_image_bytes: int = 20_000_000
    image_model: str | None = None
    image_base_url: str | None = None
    image_api_key: str = field(default="", repr=False)
    image_response_format: str | None = None
    image_size: str | None = None
    moa_models: tuple[str, ...] = ()
    moa_aggregator: str | None = None
    search_backend: str | None = None
    search_credential: str = field(default="", repr=False)
    tavily_base_url: str = "https://api.tavily.com"
    brave_base_url: str = "https://api.search.brave.com"
    web_timeout: float = 30.0
    web_extract_max_bytes: int = 5_000_000
    web_extract_max_urls: int = 10
    browser_executable: str = "/usr/bin/chromium"

    @property
    def search_unavailable(self) -> str | None:
        """Why web_search cannot be offered, or None."""
        if self.search_backend:
            return None
        return "no web search backend configured: set " + ", ".join(SEARCH_BACKENDS.values())

    def image_endpoint(self, base_url: str, api_key: str) -> tuple[str, str] | None:
        """(URL, key) of the images endpoint when it is not the run's own (`base_url`); None when it is.

        A key goes only where it belongs: the run's key (`api_key`) to the run's origin (scheme, host and
        port), IMAGE_API_KEY to --image_base_url. Another origin without IMAGE_API_KEY gets no key; to send
        it the run's key, the user sets IMAGE_API_KEY to it.
        """
        url = self.image_base_url or base_url
        if self.image_api_key:
            return url, self.image_api_key
        if _origin(url) == _origin(base_url):
            return None if url == base_url else (url, api_key)
        return url, ""

    def secrets(self) -> tuple[str, ...]:
        """The credentials held here, for redaction."""
        return tuple(s for s in (self.image_api_key, self.search_credential) if s)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return (
        parts.scheme.lower(),
        (parts.hostname or "").lower(),
        parts.port or {"http": 80, "https": 443}.get(parts.scheme),
    )


def _positive(kind: Callable[[str], Any], maximum: float) -> Callable[[str, str], Any]:
    """A number above 0 and at most `maximum` ("nan", "inf" and 1e999 are none: they would fail every call)."""

    def parse(name: str, text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not 0 < value <= maximum:
            raise FatalError(f"{name} must be a number above 0 and at most {maximum:.15g}, got {text!r}")
        return value

    return parse


def _text(name: str, text: str) -> str:
    return text


def _choice(*allowed: str) -> Callable[[str, str], str]:
    def parse(name: str, text: str) -> str:
        if text.lower() not in allowed:
            raise FatalError(f"{name} must be one of {', '.join(allowed)}, got {text!r}")
        return text.lower()

    return parse


# Environment variable -> (field, parser). Empty values count as unset.
ENVIRONMENT: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "TAVILY_BASE_URL": ("tavily_base_url", _text),
    "BRAVE_BASE_URL": ("brave_base_url", _text),
    "WEB_TIMEOUT": ("web_timeout", _positive(float, _WEEK)),
    "WEB_EXTRACT_MAX_BYTES": ("web_extract_max_bytes", _positive(int, _GIB)),
    "WEB_EXTRACT_MAX_URLS": ("web_extract_max_urls", _positive(int, 1000)),
    "VISION_MAX_IMAGE_BYTES": ("vision_max_image_bytes", _positive(int, _GIB)),
    "IMAGE_MODEL": ("image_model", _text),
    "IMAGE_API_KEY": ("image_api_key", _text),
    "IMAGE_RESPONSE_FORMAT": ("image_response_format", _choice("url", "b64_json")),
    "IMAGE_SIZE": ("image_size", _text),
    "BROWSER_EXECUTABLE": ("browser_executable", _text),
}
READ_ELSEWHERE = ("WEB_SEARCH_BACKEND", PRIVATE_URLS_VAR, *SEARCH_BACKENDS.values())


def from_environment(env: Mapping[str, str], **flags: Any) -> ToolSettings:
    """The settings from the flags' values and the environment (flags win); raises FatalError naming a bad one."""
    values: dict[str, Any] = {}
    for name, (attr, parse) in ENVIRONMENT.items():
        text = (env.get(name) or "").strip()
        if text:
            values[attr] = parse(name, text)
    values.update({k: v for k, v in flags.items() if v is not None})
    unknown = set(values) - {f.name for f in fields(ToolSettings)} - {"allow_private_urls"}
    if unknown:
        raise TypeError(f"not tool settings: {sorted(unknown)}")
    allow_all = bool(values.pop("allow_private_urls", False))
    values["private_networks"] = None if allow_all else private_networks(env.get(PRIVATE_URLS_VAR, ""))
    values["search_backend"], values["search_credential"] = search_backend(env)
    return ToolSettings(**values)


def private_networks(value: str) -> tuple[Network, ...] | None:
    """BATCH_RUNNER_ALLOW_PRIVATE_URLS: 1/true allows every address (None), a list of networks only those."""
    value = value.strip()
    if value.lower() in _TRUE:
        return None
    if value.lower() in _FALSE:
        return ()
    networks = []
    for item in value.split(","):
        if item.strip():
            try:
                networks.append(ipaddress.ip_network(item.strip(), strict=False))
            except ValueError:
                raise FatalError(
                    f"{PRIVATE_URLS_VAR}={value!r}: {item.strip()!r} is not a network such as 10.0.0.0/8"
                ) from None
    return tuple(networks)


def search_backend(env: Mapping[str, str]) -> tuple[str | None, str]:
    """(backend name, its credential or URL): WEB_SEARCH_BACKEND's choice, else the first configured."""
    chosen = (env.get("WEB_SEARCH_BACKEND") or "").strip().lower()
    if chosen:
        variable = SEARCH_BACKENDS.get(chosen)
        if variable is None:
            raise FatalError(f"WEB_SEARCH_BACKEND={chosen!r} is not one of {', '.join(SEARCH_BACKENDS)}")
        if not (env.get(variable) or "").strip():
            raise FatalError(f"WEB_SEARCH_BACKEND={chosen} but {variable} is not set")
        return chosen, env[variable].strip()
    for name, variable in SEARCH_BACKENDS.items():
        if (env.get(variable) or "").strip():
            return name, env[variable].strip()
    return None, ""
