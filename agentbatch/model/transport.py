"""The model calls' HTTP: one keep-alive HTTP/1.1 connection per thread, a JSON POST in one send, the reply read back.

Why not httpx: its request and response handling (URL and header models, h11's state machine, the pool's
bookkeeping) cost ~1.2 ms of CPU per call on a 2-core machine, against ~0.1 ms here, and importing it took
~0.3 s of every start (bench/RESULTS.md). What httpx did that a model endpoint needs is kept: TLS verified
against certifi's bundle (or SSL_CERT_FILE / SSL_CERT_DIR), gzip and deflate replies, chunked replies,
per-operation timeouts, and a stale keep-alive connection replaced before it is used. Added: an overall
deadline (a server trickling a byte a second cannot hold a call past it) and a cap on a reply's size,
compressed or not, checked as it arrives. An endpoint the
environment routes through a proxy (HTTPS_PROXY, ALL_PROXY, NO_PROXY...) keeps going through httpx, which
handles every proxy kind.
"""

from __future__ import annotations

import io
import json
import os
import re
import select
import socket
import time
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from agentbatch.model import addresses

if TYPE_CHECKING:
    import ssl

_MAX_LINE = 65536
_MAX_HEADERS = 200
_MAX_HEAD = 256 * 1024  # the reply's header (or trailer) lines together: 128 slots each hold one at most


class TransportError(Exception):
    """The connection failed, dropped, or the server broke the protocol; the message is the one-line reason."""


class TransportTimeout(TransportError):
    """A connect, send or read took longer than the timeout, or the call outlived its deadline."""


class BadReply(TransportError):
    """The reply cannot be used: not HTTP/1.1's framing, over the size cap, or a body its Content-Encoding cannot
    decode."""


@dataclass
class Response:
    """A reply: status, headers (lower-case names) and the decoded body."""

    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class Origin:
    """Where a base URL's requests go: scheme, host, port, and the path prefix of every request."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def of(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def proxied(url: str) -> bool:
    """Whether the environment sends requests to this URL through a proxy (as httpx's trust_env would)."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return False  # the usual case, without importing urllib.request (~15 ms of every start)
    from urllib.request import getproxies_environment, proxy_bypass_environment

    proxies = getproxies_environment()
    scheme = urlsplit(url).scheme
    if not (proxies.get(scheme) or proxies.get("all")):
        return False
    return not proxy_bypass_environment(urlsplit(url).hostname or "", proxies)


def ssl_context() -> ssl.SSLContext:
    """Certificate checks as httpx makes them: SSL_CERT_FILE, else SSL_CERT_DIR, else certifi's bundle."""
    import ssl  # here: only https endpoints need it, and importing it is ~10 ms of every start

    if os.environ.get("SSL_CERT_FILE"):
        ctx = ssl.create_default_context(cafile=os.environ["SSL_CERT_FILE"])
    elif os.environ.get("SSL_CERT_DIR"):
        ctx = ssl.create_default_context(capath=os.environ["SSL_CERT_DIR"])
    else:
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class Connection:
    """One keep-alive connection to an origin, used by one thread at a time; reconnects when it must."""

    def __init__(self, origin: Origin, headers: dict[str, str], timeout: float, tls: ssl.SSLContext | None = None):
        self.origin = origin
        self.timeout = timeout
        self._tls = tls
        lines = [f"Host: {origin.host_header}", "Accept-Encoding: gzip, deflate", "Connection: keep-alive"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self._headers = ("\r\n".join(lines) + "\r\n").encode("latin-1")
        self._sock: socket.socket | None = None
        self._reader = None
        self._raw: _DeadlineReader | None = None

    def post(
        self,
        path: str,
        body: bytes,
        deadline: float | None = None,
        max_bytes: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """POST body (JSON) to origin prefix + path; TransportError or TransportTimeout when it cannot.

        `deadline` (time.monotonic()) ends the whole call, connecting to the last byte; a reply body over
        `max_bytes`, before or after decompression, is BadReply. `headers` are sent with this request alone.
        """
        target = (self.origin.prefix + path).encode("latin-1")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode("latin-1")
        head = b"POST %s HTTP/1.1\r\n%s%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (
            target,
            self._headers,
            extra,
            len(body),
        )
        try:
            if self._sock is None or self._stale():
                self._connect(deadline)
            self._raw.deadline = deadline
            self._sock.settimeout(self._timeout_left(deadline))
            # Head and body in one send: two would cost a second trip through the loopback stack, and with
            # Nagle's algorithm at the server a delayed ACK.
            self._sock.sendall(head + body)
            response, keep = read_response(self._reader, max_bytes)
        except TimeoutError as e:
            self.close()
            raise TransportTimeout("request timed out") from e
        except BadReply:
            self.close()
            raise
        except (OSError, ValueError) as e:
            self.close()
            raise TransportError("connection failed or dropped") from e
        if not keep:
            self.close()
        return response

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._reader.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = self._reader = self._raw = None

    def _timeout_left(self, deadline: float | None) -> float:
        if deadline is None:
            return self.timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return min(self.timeout, left)

    def _connect(self, deadline: float | None) -> None:
        self.close()
        sock = addresses.connect(self.origin.host, self.origin.port, self._timeout_left(deadline))
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.origin.scheme == "https":
                if self._tls is None:
                    self._tls = ssl_context()
                sock = self._tls.wrap_socket(sock, server_hostname=self.origin.host)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._raw = _DeadlineReader(sock, self)
        self._reader = io.BufferedReader(self._raw, 65536)

    def _stale(self) -> bool:
        """An idle keep-alive connection with something to read was closed (or broken) by the server."""
        if self.origin.scheme == "https" and self._sock.pending():
            return True
        poller = select.poll()
        poller.register(self._sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))


def read_response(reader, max_bytes: int | None) -> tuple[Response, bool]:
    """One reply from a buffered reader, its body over `max_bytes` (before or after decompression) refused as it
    arrives; True when the connection may carry the next request.

    BadReply when the reply breaks HTTP/1.1's framing; ConnectionError when the connection ends inside it.
    """
    for _ in range(_MAX_INTERIM + 1):
        version, status = _status_line(reader.readline(_MAX_LINE + 1))
        headers = _headers(reader)
        if status >= 200 or status == 101:
            break  # 1xx replies (100 Continue) come before the real one
    else:
        raise BadReply(f"over {_MAX_INTERIM} interim (1xx) replies")
    conn = headers.get("connection", "").lower()
    keep = "close" not in conn and (version == "HTTP/1.1" or "keep-alive" in conn)
    cap = max_bytes if max_bytes is not None else -1
    body, framed = _body(reader, status, headers, cap)
    encoding = headers.get("content-encoding", "").lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        body = _decompress(body, encoding, cap)
    return Response(status, headers, body), keep and framed


# The reply's framing, as RFC 9112 writes it: anything else is BadReply, never a guess. int() would take "-1",
# "+5", " 5", "1_0", "0x1f" and digits of other scripts: a chunk size of -1 once read the body to its end.
_STATUS = re.compile(rb"(HTTP/1\.[01]) ([0-9]{3})(?: [^\x00\x0b\x0c\r\n]*)?\r?\n")
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([^\r\n]*)\r?\n")
_CONTROL = re.compile(rb"[\x00\x0b\x0c\r\n]")  # not in a field's value (as h11 reads it: servers send the rest)
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:;[^\r\n]*)?[ \t]*\r\n")
_LENGTH = re.compile(r"[0-9]+", re.ASCII)
_MAX_INTERIM = 10  # 100 Continue and the like before the reply
_BLOCK = 1 << 20  # a body is read in blocks: its size allocates nothing before its bytes arrive


def _status_line(line: bytes) -> tuple[str, int]:
    if not line:
        raise ConnectionError("server closed the connection without a reply")
    found = _STATUS.fullmatch(line)
    if found is None:
        _check_whole(line)
        raise BadReply(f"not an HTTP/1.1 reply: {line[:80]!r}")
    return found.group(1).decode(), int(found.group(2))


def _check_whole(line: bytes) -> None:
    """A line that ended without its newline, and is not too long for one, was cut by the connection's end."""
    if not line.endswith(b"\n") and len(line) <= _MAX_LINE:
        raise ConnectionError("connection closed in the reply")


def _headers(reader) -> dict[str, str]:
    """The header lines up to the blank line (names lower-cased, repeated ones joined by commas), in at most
    _MAX_HEAD bytes."""
    headers: dict[str, str] = {}
    name = ""
    size = 0
    for _ in range(_MAX_HEADERS):
        line = reader.readline(_MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return headers
        if not line:
            raise ConnectionError("connection closed in the reply's headers")
        size += len(line)
        if len(line) > _MAX_LINE or size > _MAX_HEAD:
            raise BadReply("the reply's headers are too long")
        if line[0] in b" \t" and name:  # obs-fold: the line continues the field before it
            value = line
        else:
            field = _FIELD.fullmatch(line)
            if field is None:
                raise BadReply(f"bad header line: {line[:80]!r}")
            name, value = field.group(1).decode("ascii").lower(), field.group(2)
            if name in headers:
                headers[name] += ","  # a repeated field is one, its values joined by commas
        if _CONTROL.search(value.rstrip(b"\r\n")):
            raise BadReply(f"bad header line: {line[:80]!r}")
        value = value.decode("latin-1").strip(" \t\r\n")
        headers[name] = f"{headers[name]} {value}".strip() if name in headers else value
    raise BadReply(f"over {_MAX_HEADERS} header lines")


def _body(reader, status: int, headers: dict[str, str], cap: int) -> tuple[bytes, bool]:
    """The body as the headers frame it, at most `cap` bytes (< 0: no cap); False: it ran to the connection's end."""
    coding = headers.get("transfer-encoding")
    if coding is not None and coding.strip().lower() != "chunked":  # a transfer coding nothing here would undo
        raise BadReply(f"unsupported Transfer-Encoding {coding[:40]!r}")
    declared = headers.get("content-length")
    if declared is not None and not _LENGTH.fullmatch(declared):
        raise BadReply(f"bad Content-Length {declared[:40]!r}")
    if status in (101, 204, 304):
        return b"", status != 101
    if coding is not None:
        return _chunked(reader, cap), True
    if declared is not None:
        if len(declared) > 18:  # no reply is an exabyte: refused before int() turns 4,300 digits into a number
            raise BadReply(f"Content-Length of {len(declared)} digits")
        length = int(declared)
        if 0 <= cap < length:
            raise BadReply(f"{length} bytes, over the {cap}-byte reply limit")
        return _exactly(reader, length), True
    return _until_close(reader, cap), False  # no length: the body runs until the server closes the connection


def _exactly(reader, size: int) -> bytes:
    """`size` bytes, read in blocks: a short read is a dropped connection."""
    if size <= _BLOCK:
        data = reader.read(size)
    else:
        blocks = []
        left = size
        while left:
            block = reader.read(min(left, _BLOCK))
            if not block:
                break
            blocks.append(block)
            left -= len(block)
        data = b"".join(blocks)
    if len(data) < size:
        raise ConnectionError("reply cut short")
    return data


def _until_close(reader, cap: int) -> bytes:
    if cap < 0:
        return reader.read()
    body = reader.read(cap + 1)
    _check_size(body, cap)
    return body


def _chunked(reader, cap: int = -1) -> bytes:
    body = bytearray()  # not a list of parts: 8 MiB of one-byte chunks would be 8 million objects
    while True:
        line = reader.readline(_MAX_LINE + 1)
        if not line:
            raise ConnectionError("connection closed in a chunked reply")
        found = _CHUNK_SIZE.fullmatch(line)
        if found is None:
            _check_whole(line)
            raise BadReply(f"bad chunk size line {line[:40]!r}")
        size = int(found.group(1), 16)
        if size == 0:
            _headers(reader)  # the trailer fields, read as the header fields are and left
            return bytes(body)
        if 0 <= cap < len(body) + size:
            raise BadReply(f"over the {cap}-byte reply limit")
        body += _exactly(reader, size)
        end = reader.readline(3)
        if end != b"\r\n":
            if not end:
                raise ConnectionError("connection closed in a chunked reply")
            raise BadReply("a chunk runs past its size")


def _check_size(body: bytes, cap: int) -> None:
    if 0 <= cap < len(body):
        raise BadReply(f"over the {cap}-byte reply limit")


def _decompress(body: bytes, encoding: str, cap: int) -> bytes:
    """A gzip or deflate body, decoded to at most `cap` bytes (a small bomb must not take the memory)."""
    # gzip; else zlib-wrapped deflate, then raw deflate, which some servers send as "deflate"
    error: Exception | None = None
    for wbits in (16 + zlib.MAX_WBITS,) if encoding != "deflate" else (zlib.MAX_WBITS, -zlib.MAX_WBITS):
        try:
            out = zlib.decompressobj(wbits).decompress(body, cap + 1 if cap >= 0 else 0)
        except zlib.error as e:
            error = e
            continue
        _check_size(out, cap)
        return out
    raise BadReply(f"the {encoding} body cannot be decoded: {error}")


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting at most until the connection's current deadline."""

    def __init__(self, sock: socket.socket, conn: Connection):
        self._sock = sock
        self._conn = conn
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._sock.settimeout(self._conn._timeout_left(self.deadline))
        return self._sock.recv_into(buffer)


class ProxiedConnection:
    """The same calls through httpx, for an endpoint the environment routes through a proxy."""

    def __init__(self, origin: Origin, headers: dict[str, str], timeout: float):
        import httpx

        import agentbatch.http_deadline as http_deadline

        self._httpx = httpx
        self._deadline = http_deadline.deadline
        self._base = f"{origin.scheme}://{origin.host_header}{origin.prefix}"
        self._timeout = timeout
        self._client = http_deadline.client(timeout=timeout, headers={**headers, "Content-Type": "application/json"})

    def post(
        self,
        path: str,
        body: bytes,
        deadline: float | None = None,
        max_bytes: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        httpx = self._httpx
        left = self._timeout if deadline is None else deadline - time.monotonic()
        cap = max_bytes if max_bytes is not None else -1
        try:
            with (
                self._deadline(left),
                self._client.stream("POST", self._base + path, content=body, headers=headers) as r,
            ):
                declared = r.headers.get("content-length", "")
                if _LENGTH.fullmatch(declared) and 0 <= cap < int(declared):
                    raise BadReply(f"{int(declared)} bytes, over the {cap}-byte reply limit")
                content = bytearray()
                for chunk in r.iter_bytes():
                    content += chunk
                    _check_size(content, cap)
        except httpx.TimeoutException as e:
            raise TransportTimeout("request timed out") from e
        except httpx.DecodingError as e:
            raise BadReply(f"the body cannot be decoded: {str(e)[:200]}") from e
        except httpx.RemoteProtocolError as e:  # h11 found the reply's framing broken
            raise BadReply(f"not HTTP/1.1's framing: {str(e)[:200]}") from e
        except httpx.TransportError as e:
            raise TransportError("connection failed or dropped") from e
        return Response(r.status_code, {k.lower(): v for k, v in r.headers.items()}, bytes(content))

    def close(self) -> None:
        self._client.close()
