"""The model calls' HTTP client against real sockets: keep-alive, reply framings, stale connections, TLS, proxies."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from raw_server import RawServer, ok
from scripted_server import ScriptedServer

from agentbatch.model import transport
from agentbatch.model.client import ModelCallError, ModelClient, ModelSettings

REPLY = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}


def connection(server: RawServer, timeout: float = 10.0) -> transport.Connection:
    origin = transport.Origin.of(f"http://127.0.0.1:{server.port}/v1")
    return transport.Connection(origin, {"Authorization": "Bearer k-123"}, timeout)


def keep_answering(server, conn, reader, index):
    while server.read_request(reader) is not None:
        conn.sendall(ok(b'{"n": %d}' % index))


def test_requests_reuse_one_keep_alive_connection_and_carry_head_and_body():
    server = RawServer(keep_answering)
    c = connection(server)
    replies = [c.post("/chat/completions", b'{"x": 1}').json() for _ in range(3)]
    assert replies == [{"n": 1}] * 3 and server.connections == 1
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1" and body == b'{"x": 1}'
    assert {b"Host: 127.0.0.1:%d" % server.port, b"Authorization: Bearer k-123", b"Content-Length: 8"} <= set(lines)


@pytest.mark.parametrize("framing", ["chunked", "gzip", "deflate", "until close", "100 continue"])
def test_every_reply_framing_is_read(framing):
    payload = json.dumps(REPLY).encode()

    def answer(server, conn, reader, index):
        if index > 1:  # the connection after one the server ended
            return keep_answering(server, conn, reader, index)
        server.read_request(reader)
        if framing == "chunked":
            chunks = [payload[:10], payload[10:]]
            body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
        elif framing == "gzip":
            conn.sendall(ok(gzip.compress(payload), b"Content-Encoding: gzip\r\n"))
        elif framing == "deflate":
            import zlib

            conn.sendall(ok(zlib.compress(payload), b"Content-Encoding: deflate\r\n"))
        elif framing == "until close":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + payload)
            conn.shutdown(socket.SHUT_WR)
        else:
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(payload))
        keep_answering(server, conn, reader, index)

    server = RawServer(answer)
    c = connection(server)
    assert c.post("/chat/completions", b"{}").json() == REPLY
    assert c.post("/chat/completions", b"{}").json() == {"n": server.connections}


def test_a_connection_the_server_closed_while_idle_is_replaced_before_use():
    def once_then_close(server, conn, reader, index):
        server.read_request(reader)
        conn.sendall(ok(b'{"n": %d}' % index))  # keep-alive promised, then closed while idle

    server = RawServer(once_then_close)
    c = connection(server)
    assert c.post("/p", b"{}").json() == {"n": 1}
    time.sleep(0.2)  # the close reaches the client
    assert c.post("/p", b"{}").json() == {"n": 2}
    assert server.connections == 2


def test_connection_close_and_http_1_0_replies_are_not_reused():
    def answer(server, conn, reader, index):
        server.read_request(reader)
        version = b"HTTP/1.0" if index == 1 else b"HTTP/1.1"
        extra = b"" if index == 1 else b"Connection: close\r\n"
        conn.sendall(ok(b"{}", extra).replace(b"HTTP/1.1", version, 1))

    server = RawServer(answer)
    c = connection(server)
    for _ in range(3):
        assert c.post("/p", b"{}").json() == {}
    assert server.connections == 3


@pytest.mark.parametrize(
    "fault, error",
    [
        ("silence", transport.TransportTimeout),
        ("drop", transport.TransportError),
        ("garbage", transport.BadReply),
        ("short body", transport.TransportError),
    ],
)
def test_faults_become_one_line_transport_errors(fault, error):
    def answer(server, conn, reader, index):
        server.read_request(reader)
        if fault == "silence":
            time.sleep(3)
        elif fault == "garbage":
            conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
        elif fault == "short body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{}")
        conn.shutdown(socket.SHUT_RDWR)

    server = RawServer(answer)
    with pytest.raises(error) as raised:
        connection(server, timeout=0.5).post("/p", b"{}")
    expected = {"silence": "request timed out", "garbage": "not an HTTP/1.1 reply: b'SSH-2.0-OpenSSH\\r\\n'"}
    assert str(raised.value) == expected.get(fault, "connection failed or dropped")


def test_an_unreachable_endpoint_fails_the_call_with_its_reason():
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    client = ModelClient(ModelSettings(model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0))
    with pytest.raises(ModelCallError, match="connection failed or dropped"):
        client.chat([{"role": "user", "content": "hi"}])


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 (its own CA)."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(d / "key.pem"),
            "-out",
            str(d / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    return d / "cert.pem", d / "key.pem"


def test_https_endpoints_are_verified_against_the_configured_bundle(certificate, monkeypatch):
    import ssl

    cert, key = certificate
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)

    def answer(server, conn, reader, index):
        with tls.wrap_socket(conn, server_side=True) as wrapped, wrapped.makefile("rb") as r:
            while server.read_request(r) is not None:
                wrapped.sendall(ok(json.dumps(REPLY).encode()))

    server = RawServer(lambda s, conn, reader, i: answer(s, conn, reader, i))
    settings = ModelSettings(model="m", base_url=f"https://127.0.0.1:{server.port}/v1", api_key="k", max_retries=0)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert ModelClient(settings).chat([{"role": "user", "content": "hi"}]).choices[0].message.content == "hi"
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)  # certifi's bundle does not know this certificate
    with pytest.raises(ModelCallError, match="connection failed or dropped"):
        ModelClient(settings).chat([{"role": "user", "content": "hi"}])


class _Proxy(BaseHTTPRequestHandler):
    """A forwarding HTTP proxy: absolute-form requests are relayed to their origin."""

    protocol_version = "HTTP/1.1"
    seen: list[str] = []
    headers_seen: list[dict] = []

    def do_POST(self):
        import http.client
        from urllib.parse import urlsplit

        _Proxy.seen.append(self.path)
        _Proxy.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        upstream = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        upstream.request("POST", url.path, body=body, headers={"Content-Type": "application/json"})
        reply = upstream.getresponse()
        data = reply.read()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_an_endpoint_behind_a_proxy_is_reached_through_it(monkeypatch):
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        with ScriptedServer(default_script=[{"content": "via proxy"}]) as srv:
            monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            assert transport.proxied(srv.base_url)
            client = ModelClient(ModelSettings(model="m", base_url=srv.base_url, api_key="k", max_retries=0))
            reply = client.for_session("br-0123456789abcdef").chat([{"role": "user", "content": "hi"}])
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert not transport.proxied(srv.base_url)
        assert reply.choices[0].message.content == "via proxy"
        assert _Proxy.seen == [f"{srv.base_url}/chat/completions"]
        # A sample's session headers go through the proxy too (httpx's request headers).
        (headers,) = _Proxy.headers_seen
        assert headers["x-session-id"] == headers["x-smg-routing-key"] == "br-0123456789abcdef"
    finally:
        proxy.shutdown()
