"""Checks that turn one command-line value into a setting; every problem is a one-line FatalError."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from agentbatch.errors import FatalError
from agentbatch.model.client import PROVIDER_SORTS, REASONING_EFFORTS
from agentbatch.secrets_guard import getenv

KEY_HOSTS = ("openrouter.ai", "api.openai.com")


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """An integer flag, at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FatalError(f"--{name} must be a whole number ≥ {minimum}, got {value!r}")
    return value


def positive_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise FatalError(f"--{name} must be a positive number, got {value!r}")
    return float(value)


def non_negative_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise FatalError(f"--{name} must be a number ≥ 0, got {value!r}")
    return float(value)


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise FatalError(f"--{name} must be true or false, got {value!r}")


def name_list(name: str, value: Any) -> tuple[str, ...]:
    """A comma-separated list; Fire may already have split it into a tuple or list."""
    if value is None or value == "":
        return ()
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    elif isinstance(value, str):
        items = value.split(",")
    else:
        items = [str(value)]
    items = [i.strip() for i in items if i.strip()]
    if not items:
        raise FatalError(f"--{name} is empty; give comma-separated names")
    return tuple(items)


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    if value not in allowed:
        raise FatalError(f"--{name} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def sandbox_kind(name: str, value: Any) -> str | None:
    """--sandbox, as a backend's name (None: not given); sandboxes/choice.py checks it against the registered
    ones once the run's plug-ins are loaded, and decides."""
    return None if value is None else str(value).strip().lower()


def network(name: str, value: Any) -> bool:
    """--sandbox_network: on, or none (True: the sandbox has the host's network)."""
    text = str(value).strip().lower()
    if text not in ("on", "none"):
        raise FatalError(f"--{name} must be on or none, got {value!r}")
    return text == "on"


def size(minimum: str) -> Callable[[str, Any], int]:
    """A size such as 512m or 2g (bytes without a unit), at least `minimum`, in bytes."""

    def parse(name: str, value: Any) -> int:
        found = _size_bytes(value)
        if found is None or found < _size_bytes(minimum):
            raise FatalError(f"--{name} must be a size of at least {minimum}, such as 512m or 2g, got {value!r}")
        return found

    return parse


def _size_bytes(value: Any) -> int | None:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmg]?)b?", str(value).strip().lower())
    return int(float(m.group(1)) * _MEMORY_UNITS[m.group(2)]) if m else None


# Docker's own minimum; checked here because a bad limit would otherwise surface at every prompt's first tool call.
MIN_MEMORY_BYTES = 6 * 1024 * 1024
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def docker_memory(name: str, value: Any) -> str:
    """A container memory limit such as 512m or 2g (bytes without a unit), at least Docker's 6 MB minimum."""
    text = str(value).strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmg]?)b?", text)
    if not m or float(m.group(1)) * _MEMORY_UNITS[m.group(2)] < MIN_MEMORY_BYTES:
        raise FatalError(f"--docker_memory must be a size of at least 6m, such as 512m or 2g, got {value!r}")
    return m.group(1) + (m.group(2) or "b")


def reasoning_effort(name: str, value: Any) -> str | None:
    return choice(name, value, REASONING_EFFORTS)


def provider_sort(name: str, value: Any) -> str | None:
    return choice(name, value, PROVIDER_SORTS)


def run_name(name: str, value: Any) -> str:
    if value is None or str(value).strip() == "":
        raise FatalError("--run_name is required: output goes to data/<run_name>/")
    value = str(value)
    if "/" in value or value in (".", "..") or "\x00" in value:
        raise FatalError(f"--run_name {value!r} must be a plain name, not a path")
    return value


def api_key(flag_value: Any, base_url: str, needed: bool) -> str:
    """--api_key, else OPENROUTER_API_KEY, else OPENAI_API_KEY; required for the hosted endpoints."""
    key = str(flag_value) if flag_value else getenv("OPENROUTER_API_KEY") or getenv("OPENAI_API_KEY")
    host = urlparse(base_url).hostname or ""
    if not key and needed and any(host == h or host.endswith("." + h) for h in KEY_HOSTS):
        raise FatalError(f"no API key for {host}: pass --api_key or set OPENROUTER_API_KEY (or OPENAI_API_KEY)")
    return key or ""


def base_url(value: Any) -> str:
    value = str(value)
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise FatalError(f"--base_url must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


def prefill_messages(name: str, path: Any) -> list[dict]:
    """The prefill file: a JSON array of {role, content}."""
    if not path:
        return []
    try:
        with open(str(path), encoding="utf-8-sig") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FatalError(f"prefill file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FatalError(f"cannot read prefill file {path}: {e}") from None
    except ValueError as e:
        raise FatalError(f"prefill file {path} is not valid JSON: {e}") from None
    if not isinstance(data, list):
        raise FatalError(f"prefill file {path} must hold a JSON array of {{role, content}} objects")
    for i, m in enumerate(data):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("system", "user", "assistant")
            or not isinstance(m.get("content"), str)
        ):
            raise FatalError(
                f'prefill file {path}: item {i} must be {{"role": system|user|assistant, "content": string}}'
            )
    return [{"role": m["role"], "content": m["content"]} for m in data]
