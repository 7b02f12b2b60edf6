"""Keep the runner's secrets out of /proc/<pid>/cmdline and /proc/<pid>/environ, where sandboxed commands look.

Credentials in the environment (any variable named like *KEY*, *TOKEN*, *SECRET*, *PASSWORD*) are withdrawn
from os.environ when a run starts, so no process the runner starts (workers, multiprocessing's resource
tracker, the local model server, Chromium) inherits them; the tools read them with getenv(), and workers get
them inside their config. What stays visible is the runner's own initial environment block, masked below.

A local sandbox runs commands as the runner's own user, so `ps aux` or `cat /proc/*/environ` would show an
API key passed as `--api_key=...` or inherited in the environment. The kernel serves those two files straight
from the process's memory (the argv and initial environment blocks), so overwriting the secret there hides it.
Python's own copies (sys.argv, os.environ) are unaffected.

What a secret still reaches (a tool result, an endpoint's error message, a log line) goes through a
`Redactor` before it leaves the process: to the endpoint, to a file, to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Mapping

SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD")
REDACTED = "[REDACTED]"
# A very short "key" (tests, local servers) would redact ordinary letters out of every line.
MIN_SECRET = 8
# This many characters from the start or the end of a key count as the key: a message cut to length
# keeps a prefix of it, a head-and-tail cut a suffix. Shorter bits of a key give nothing away.
MIN_PART = 12
_held: dict[str, str] = {}


def looks_secret(name: str) -> bool:
    return any(w in name.upper() for w in SECRET_WORDS)


def withdraw_environment() -> dict[str, str]:
    """Move every credential-like variable out of os.environ (and out of this process's /proc); returns them."""
    withdrawn = {k: os.environ.pop(k) for k in list(os.environ) if looks_secret(k)}
    hold(withdrawn)
    return withdrawn


def hold(variables: Mapping[str, str]) -> None:
    """Keep withdrawn variables for getenv() (in a worker: the ones its config carries) and mask them in /proc."""
    _held.update(variables)
    hide_from_proc(v for v in variables.values() if len(v) >= 8)


def getenv(name: str, default: str | None = None) -> str | None:
    """os.environ's value, else a withdrawn one, else default."""
    return os.environ.get(name) or _held.get(name) or default


# /proc/<pid>/stat fields 48-51 (1-based, since Linux 3.5): arg_start, arg_end, env_start, env_end.
_FIRST_FIELD = 48


def memory_ranges(pid: str | int = "self") -> list[tuple[int, int]]:
    """The (start, end) addresses of a process's argv and initial environment blocks; [] when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return []
    # Field 2 (the command name) may hold spaces and parentheses: count fields after its closing ")".
    rest = stat[stat.rfind(b")") + 2 :].split()
    first = _FIRST_FIELD - 3
    if len(rest) < first + 4:
        return []
    try:
        arg_start, arg_end, env_start, env_end = (int(v) for v in rest[first : first + 4])
    except ValueError:
        return []
    return [(s, e) for s, e in ((arg_start, arg_end), (env_start, env_end)) if 0 < s < e]


def hide_from_proc(secrets: Iterable[str]) -> int:
    """Overwrite each secret in this process's argv and environment memory with '*'; best effort, never raises.

    Returns how many occurrences were overwritten. Linux only (elsewhere it does nothing).
    """
    needles = sorted({s.encode("utf-8", "surrogateescape") for s in secrets if s}, key=len, reverse=True)
    if not needles or not sys.platform.startswith("linux"):
        return 0
    hidden = 0
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            for start, end in memory_ranges():
                mem.seek(start)
                block = mem.read(end - start)
                changed = block
                for needle in needles:
                    hidden += changed.count(needle)
                    changed = changed.replace(needle, b"*" * len(needle))
                if changed != block:
                    mem.seek(start)
                    mem.write(changed)
    except (OSError, ValueError, OverflowError):
        return hidden
    return hidden


class Redactor:
    """Replaces every secret, and any long prefix or suffix of one, with [REDACTED]: the one redaction of every
    output (a line written, a log line, a tool result, a line read back for an export or the report)."""

    def __init__(self, secrets: Iterable[str] = ()):
        unique = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET}
        self.secrets = tuple(sorted(unique, key=len, reverse=True))
        # Every text this redacts holds a secret's first or last MIN_PART characters: a line holding none of
        # these bytes is left as it is without being decoded (most lines).
        self._marks = tuple({_utf8(p) for s in self.secrets for p in (s[:MIN_PART], s[-MIN_PART:])})

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
            if len(secret) > MIN_PART:
                text = _cut_parts(text, secret)
        return text

    def __bool__(self) -> bool:
        return bool(self.secrets)

    def line(self, raw: bytes) -> bytes:
        """A line of a file (UTF-8 bytes) redacted as its text is; the same object when there is nothing to redact.

        Bytes that are not UTF-8 pass through as they are (a line that did not parse still does not)."""
        if not any(m in raw for m in self._marks):
            return raw
        text = raw.decode("utf-8", "surrogateescape")
        clean = self(text)
        return raw if clean == text else clean.encode("utf-8", "surrogateescape")


def _utf8(text: str) -> bytes:
    """A secret's bytes as a file holds them (an environment value's undecodable bytes are surrogate escapes)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _cut_parts(text: str, secret: str) -> str:
    """Redact what is left of a secret that a cut split: a long prefix at one place, a long suffix at another."""
    head, tail = secret[:MIN_PART], secret[-MIN_PART:]
    start = text.find(head)
    while start >= 0:
        end = start + MIN_PART
        while end < len(text) and end - start < len(secret) and text[end] == secret[end - start]:
            end += 1
        text = text[:start] + REDACTED + text[end:]
        start = text.find(head, start + len(REDACTED))
    end = text.find(tail)
    while end >= 0:
        stop = end + MIN_PART
        begin = end
        while begin > 0 and stop - begin < len(secret) and text[begin - 1] == secret[-(stop - begin) - 1]:
            begin -= 1
        text = text[:begin] + REDACTED + text[stop:]
        end = text.find(tail, begin + len(REDACTED))
    return text


class _RedactingFilter(logging.Filter):
    """Redacts a log record's message and traceback before any handler formats it."""

    def __init__(self, redact: Redactor):
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def redact_logs(redact: Redactor) -> None:
    """Every log line this process prints from now on (--verbose included) goes through `redact` first."""
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    for handler in handlers:
        if handler is None:
            continue
        for old in [f for f in handler.filters if isinstance(f, _RedactingFilter)]:
            handler.removeFilter(old)
        handler.addFilter(_RedactingFilter(redact))
