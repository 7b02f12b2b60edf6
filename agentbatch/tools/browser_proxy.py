"""The browser's network policy: an HTTP proxy that lets a connection through only to what url_policy allows.

Chromium sends every request (navigations, each redirect hop, subresources, websockets, workers) through a
small per-session HTTP proxy on 127.0.0.1 that asks `url_policy.resolve_url` and then connects to one of the
addresses it checked, so neither a redirect nor a DNS answer that changes between check and connect can take
the browser to a refused address. (Playwright's request routing was not enough: it never sees redirect hops.)
A refused plain-HTTP request gets a 403 page saying why; a refused HTTPS or websocket tunnel fails to
connect. Service workers are blocked to keep requests plain and visible. WebRTC would send UDP past the
proxy (to a STUN or TURN server, or a peer's candidate: any address a page names), so the browser is
launched with Chromium's WebRTC IP handling policy `disable_non_proxied_udp`, which leaves WebRTC only TCP
through this proxy, and with QUIC off: nothing the browser sends goes around the policy
(browser_session.CHROMIUM_ARGS; tests/test_tools_browser.py tries each way).
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from agentbatch.tools import url_policy
from agentbatch.tools.url_policy import Networks

PROXY_IDLE_TIMEOUT = 120.0
REFUSED_HEADER = "X-URL-Policy-Refused"
_HOP_HEADERS = {"connection", "proxy-connection", "keep-alive", "proxy-authorization", "te"}


class PolicyProxy:
    """An HTTP proxy on 127.0.0.1 that lets a connection through only to addresses the URL policy allows."""

    def __init__(self, allowed: Networks, on_refusal: Callable[[str], None]):
        self.allowed = allowed
        self.on_refusal = on_refusal
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._closed = False
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="browser-proxy", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        self._closed = True
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in [self._server, *sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            if self._closed:
                sock.close()
                raise OSError("proxy closed")
            self._sockets.add(sock)
        return sock

    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            self._track(client)
            client.settimeout(PROXY_IDLE_TIMEOUT)
            head, rest = _read_head(client)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target, version = lines[0].split(" ", 2)
            if method.upper() == "CONNECT":
                url, port = f"https://{target}/", int(target.rpartition(":")[2])
            else:
                url = target
                parts = urlsplit(target)
                port = parts.port or 80
            try:
                addresses = url_policy.resolve_url(url, self.allowed)
            except ValueError as e:
                if not str(e).startswith("refusing"):  # a name that does not resolve is no policy matter
                    client.sendall(f"{version} 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n".encode())
                    return
                self.on_refusal(str(e))
                body = f"Refused by the URL policy: {e}\n".encode()
                client.sendall(
                    f"{version} 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n{REFUSED_HEADER}: 1\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                return
            try:
                upstream = self._track(_connect(addresses, port))
            except OSError as e:
                client.sendall(f"{version} 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
                raise e
            if method.upper() == "CONNECT":
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                # One request per connection: Chromium reuses proxy connections across hosts, which must each
                # be checked, so the upstream is told to close after its response.
                parts = urlsplit(target)
                path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                kept = [h for h in lines[1:] if h and h.split(":", 1)[0].strip().lower() not in _HOP_HEADERS]
                request = [f"{method} {path} {version}", *kept, "Connection: close", "", ""]
                upstream.sendall("\r\n".join(request).encode("latin-1"))
            if rest:
                upstream.sendall(rest)
            _pipe(client, upstream, tunnel=method.upper() == "CONNECT")
        except (OSError, ValueError):
            pass
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._sockets.discard(sock)
                    sock.close()


def _read_head(sock: socket.socket) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or len(data) > 256 * 1024:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _connect(addresses: list[str], port: int) -> socket.socket:
    error: OSError | None = None
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout=30)
        except OSError as e:
            error = e
    raise error or OSError("no address to connect to")


def _pipe(a: socket.socket, b: socket.socket, tunnel: bool) -> None:
    """Copy bytes both ways until both sides have finished sending (a plain request: until b, the server, has)."""
    open_ends = {a: b, b: a}
    for sock in open_ends:
        sock.settimeout(None)
    while open_ends:
        readable, _, _ = select.select(list(open_ends), [], [], PROXY_IDLE_TIMEOUT)
        if not readable:
            return
        for sock in readable:
            data = sock.recv(65536)
            if data:
                open_ends[sock].sendall(data)
            elif sock is b and not tunnel:
                return
            else:
                try:
                    open_ends[sock].shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                del open_ends[sock]
