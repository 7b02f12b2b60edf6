"""Checks that turn one command-line value into a setting; every problem is a one-line FatalError."""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse, urlsplit

from agentbatch.errors import FatalError
from agentbatch.model import numbers
from agentbatch.model.client import PROVIDER_SORTS, REASONING_EFFORTS
from agentbatch.secrets_guard import getenv

KEY_HOSTS = ("openrouter.ai", "api.openai.com")


# The most a flag may ask for. Beyond these a value is a slip of the keyboard, and past some of them what the
# value configures breaks at every use, not at start: 1e999 seconds is inf, which no socket, wait or process
# timeout takes (socket timeouts stop near 1e10 s), a size past 2**63 no rlimit takes, a retry count past ~1,000
# overflows the backoff's float.
MAX_SECONDS = 7 * 24 * 3600.0
MAX_PRICE = 1e6  # USD per million tokens
MAX_SIZE = 1 << 44  # 16 TiB
SIZE_UNITS = "16384g"


def shown(value: Any) -> str:
    """A value as an error quotes it: its repr, cut to about 60 characters (a flag's value may be thousands of
    characters long; an integer past Python's 4300 digits has no repr at all)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"a whole number of about {int(value.bit_length() * 0.30103)} digits"
    text = _SHOWN.repr(value)
    return f"{text} ({len(value)} characters)" if isinstance(value, str) and len(value) > _SHOWN.maxstring else text


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 4, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 50


def number(minimum: float, maximum: float, what: str = "a number", whole: bool = False, above: bool = False):
    """A check: a finite number (`whole`: an integer) from `minimum` (`above`: excluded) to `maximum`."""
    low, high = f"{minimum:.15g}", f"{maximum:.15g}"
    rule = f"{what} above {low} and at most {high}" if above else f"{what} from {low} to {high}"

    def check(name: str, value: Any):
        kinds = int if whole else (int, float)
        fits = not isinstance(value, bool) and isinstance(value, kinds) and minimum <= value <= maximum
        if not fits or (above and value == minimum):
            raise FatalError(f"--{name} must be {rule}, got {shown(value)}")
        return value if whole else float(value)

    return check


def whole(minimum: int, maximum: int):
    """A check: an integer from `minimum` to `maximum`."""
    return number(minimum, maximum, "a whole number", whole=True)


seconds = number(0, MAX_SECONDS, "a number of seconds", above=True)
usd = number(0, numbers.MAX_USD, "an amount of USD", above=True)
price = number(0, MAX_PRICE, "a price in USD per million tokens")


def boolean(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise FatalError(f"--{name} must be true or false, got {shown(value)}")


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
        raise FatalError(f"--{name} must be one of {', '.join(allowed)}, got {shown(value)}")
    return value


def sandbox_kind(name: str, value: Any) -> str | None:
    """--sandbox, as a backend's name (None: not given); sandboxes/choice.py checks it against the registered
    ones once the run's plug-ins are loaded, and decides."""
    return None if value is None else str(value).strip().lower()


def network(name: str, value: Any) -> bool:
    """--sandbox_network: on, or none (True: the sandbox has the host's network)."""
    text = str(value).strip().lower()
    if text not in ("on", "none"):
        raise FatalError(f"--{name} must be on or none, got {shown(value)}")
    return text == "on"


def size(minimum: str) -> Callable[[str, Any], int]:
    """A size such as 512m or 2g (bytes without a unit), from `minimum` to MAX_SIZE, in bytes."""

    def parse(name: str, value: Any) -> int:
        found = _size_bytes(value)
        if found is None or not _size_bytes(minimum) <= found <= MAX_SIZE:
            raise FatalError(
                f"--{name} must be a size from {minimum} to {SIZE_UNITS}, such as 512m or 2g, got {shown(value)}"
            )
        return found

    return parse


def _size_bytes(value: Any) -> int | None:
    """Bytes of a size written in ASCII digits ("١g" is not one), or None."""
    if isinstance(value, int) and value.bit_length() > 200:
        return None  # past any size (and past what str() converts, at 4300 digits)
    m = _SIZE.fullmatch(str(value).strip().lower())
    if not m or len(m.group(1)) > 30:
        return None
    return int(float(m.group(1)) * _MEMORY_UNITS[m.group(2)])


_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([bkmg]?)b?", re.ASCII)
# Docker's own minimum; checked here because a bad limit would otherwise surface at every sample's first tool call.
MIN_MEMORY_BYTES = 6 * 1024 * 1024
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def docker_memory(name: str, value: Any) -> str:
    """A container memory limit such as 512m or 2g (bytes without a unit), from Docker's 6 MB minimum to MAX_SIZE."""
    found = _size_bytes(value)
    if found is None or not MIN_MEMORY_BYTES <= found <= MAX_SIZE:
        raise FatalError(f"--{name} must be a size from 6m to {SIZE_UNITS}, such as 512m or 2g, got {shown(value)}")
    return str(found)


def reasoning_effort(name: str, value: Any) -> str | None:
    return choice(name, value, REASONING_EFFORTS)


def provider_sort(name: str, value: Any) -> str | None:
    return choice(name, value, PROVIDER_SORTS)


def run_name(name: str, value: Any) -> str:
    if value is None or str(value).strip() == "":
        raise FatalError("--run_name is required: output goes to data/<run_name>/")
    value = str(value)
    if "/" in value or value in (".", "..") or "\x00" in value:
        raise FatalError(f"--run_name {shown(value)} must be a plain name, not a path")
    return value


def api_key(flag_value: Any, base_url: str, needed: bool) -> str:
    """--api_key, else OPENROUTER_API_KEY, else OPENAI_API_KEY (header_safe); required for the hosted endpoints."""
    source = "--api_key"
    key = str(flag_value) if flag_value else ""
    for variable in ("OPENROUTER_API_KEY", "OPENAI_API_KEY"):
        if not key:
            key, source = getenv(variable) or "", variable
    host = urlparse(base_url).hostname or ""
    if not key and needed and any(host == h or host.endswith("." + h) for h in KEY_HOSTS):
        raise FatalError(f"no API key for {host}: pass --api_key or set OPENROUTER_API_KEY (or OPENAI_API_KEY)")
    return header_safe(source, key)


def header_safe(source: str, key: Any) -> str | None:
    """A key for an Authorization header: a character a header cannot carry (a newline, a space, a non-ASCII
    letter) would break or forge the header of every call, so it stops the run, the key never printed."""
    if key and not _HEADER_SAFE.fullmatch(str(key)):
        raise FatalError(
            f"the API key of {source} holds a character an HTTP header cannot carry (a space, a line break or a "
            "non-ASCII character): check how it was copied"
        )
    return None if key is None else str(key)


def label(name: str, value: Any) -> str | None:
    """A short label (--policy_version): printable text of at most 200 characters, or None."""
    if value is None:
        return None
    text = str(value)
    if not text or len(text) > 200 or not text.isprintable():
        raise FatalError(f"--{name} must be printable text of 1 to 200 characters")
    return text


_HEADER_SAFE = re.compile(r"[\x21-\x7e]+", re.ASCII)
_URL_UNSAFE = re.compile(r"[^\x21-\x7e]", re.ASCII)


def url(name: str, value: Any, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """An endpoint's URL: one of `schemes`, a host, a port from 1 to 65535, printable ASCII, no credentials."""
    text = str(value)
    problem = None
    if _URL_UNSAFE.search(text):
        problem = "it holds a space, a control or a non-ASCII character (give the host in its ASCII form)"
    else:
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as e:  # "http://[::1", "http://h:99999", "http://h:x"
            problem = "the port must be a number from 1 to 65535" if "port" in str(e).lower() else str(e)
        else:
            if parts.scheme not in schemes:
                problem = f"it must start with {' or '.join(s + '://' for s in schemes)}"
            elif not parts.hostname:
                problem = "it names no host"
            elif port == 0:
                problem = "the port must be a number from 1 to 65535"
            elif parts.username is not None or parts.password is not None:
                problem = "credentials go in --api_key, not in the URL"
    if problem:
        without_credentials = re.sub(r"//[^/@]*@", "//", text)
        raise FatalError(f"--{name} {shown(without_credentials)} is not a usable URL: {problem}")
    return text.rstrip("/")


def base_url(name: str, value: Any) -> str:
    """--base_url: an http(s) URL, or `local` (the embedded model)."""
    return "local" if str(value) == "local" else url(name, value)


def optional_url(name: str, value: Any) -> str | None:
    return None if value is None else url(name, value)


def ray_address(name: str, value: Any) -> str | None:
    """--ray_address: local, auto, host:port, or ray://host:port (a port from 1 to 65535)."""
    if value is None or str(value) in ("local", "auto"):
        return None if value is None else str(value)
    text = str(value)
    url(name, text if "://" in text else f"ray://{text}", schemes=("ray",))
    return text


# Files named by flags are read whole at start: a device (/dev/zero), a FIFO or a huge file must not be.
MAX_FLAG_FILE_BYTES = 16 * 1024 * 1024


def read_flag_file(name: str, path: str, what: str) -> bytes:
    """The bytes of a regular file of at most MAX_FLAG_FILE_BYTES; FatalError naming `what` and why not."""
    try:
        # Not blocking: opening a FIFO for reading would wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise FatalError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise FatalError(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        kind = os.fstat(fd).st_mode
        if stat.S_ISDIR(kind):
            raise FatalError(f"cannot read {what} {path}: it is a directory")
        if not stat.S_ISREG(kind):
            raise FatalError(f"cannot read {what} {path}: not a regular file (--{name} takes a file)")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_FLAG_FILE_BYTES + 1)
    except OSError as e:
        raise FatalError(f"cannot read {what} {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FLAG_FILE_BYTES:
        raise FatalError(f"{what} {path} is over {MAX_FLAG_FILE_BYTES // (1024 * 1024)} MiB")
    return data


def prefill_messages(name: str, path: Any) -> list[dict]:
    """The prefill file: a JSON array of {role, content}."""
    if not path:
        return []
    data = read_flag_file(name, str(path), "prefill file")
    try:
        data = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise FatalError(f"cannot read prefill file {path}: {e}") from None
    except (ValueError, RecursionError) as e:
        raise FatalError(f"prefill file {path} is not valid JSON: {str(e)[:200]}") from None
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


def input_file(name: str, value: Any) -> str | None:
    """A file the run reads whole at start (--mcp_config, --distributions_file): a regular file of at most
    MAX_FLAG_FILE_BYTES; a missing one is left to its reader, which names it."""
    path, info = _stat(value)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise FatalError(f"--{name} {path} is not a regular file (a directory, device or FIFO)")
    if info is not None and info.st_size > MAX_FLAG_FILE_BYTES:
        raise FatalError(f"--{name} {path} is over {MAX_FLAG_FILE_BYTES // (1024 * 1024)} MiB")
    return path


def input_path(name: str, value: Any) -> str | None:
    """A file or directory the run reads (the dataset): not a device, FIFO or socket, which would never end."""
    path, info = _stat(value)
    if info is not None and not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise FatalError(f"--{name} {path} is not a regular file (a device, FIFO or socket is never read to its end)")
    return path


def _stat(value: Any) -> tuple[str | None, os.stat_result | None]:
    """The path a flag names and what it is; None when there is no path, or nothing (readable) there: its
    reader then says so, naming the file."""
    if value is None:
        return None, None
    path = str(value)
    try:
        return path, os.stat(path)
    except OSError:
        return path, None


def expiry(name: str, value: Any) -> float | None:
    """--cache_expiry in Inspect's spelling (1D, 12h, 4W...): seconds, or None for `never` (model/cache.py)."""
    from agentbatch.model.cache import parse_expiry

    try:
        return parse_expiry(str(value))
    except ValueError:
        raise FatalError(
            f"--{name} must be a whole number and s, m, h, D, W, M or Y (such as 12h, 1D or 4W), or never; "
            f"got {shown(value)}"
        ) from None
