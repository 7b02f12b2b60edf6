"""A real HTTP server on 127.0.0.1 with routes given as functions, recording every request (web tool tests)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    """One request the fake site received."""

    method: str
    path: str
    query: dict
    headers: dict
    body: bytes


class FakeSite:
    """A real HTTP server on 127.0.0.1: path → handler(Seen) returning (status, headers, body); records requests.

    body is bytes, or a function that writes the body to the socket file itself (trickle_reply).
    """

    def __init__(self, routes: dict):
        self.routes = routes
        self.seen: list[Seen] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                seen = Seen(
                    self.command,
                    parts.path,
                    {k: v[0] for k, v in parse_qs(parts.query).items()},
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length) if length else b"",
                )
                site.seen.append(seen)
                route = site.routes.get(parts.path)
                status, headers, body = route(seen) if route else (404, {"Content-Type": "text/html"}, b"<h1>nope</h1>")
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if callable(body):  # a writer that takes its time (trickle_reply)
                    try:
                        body(self.wfile)
                    except OSError:
                        pass  # the client gave up
                else:
                    self.wfile.write(body)

            do_GET = do_POST = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def json_reply(data: dict, status: int = 200):
    return status, {"Content-Type": "application/json"}, json.dumps(data).encode()


def html_reply(body: bytes):
    return 200, {"Content-Type": "text/html; charset=utf-8", "Content-Length": str(len(body))}, body


def redirect(location: str, status: int = 302):
    return lambda seen: (status, {"Location": location, "Content-Length": "0"}, b"")


def trickle_reply(body: bytes, seconds: float, content_type: str = "text/html"):
    """A 200 reply whose body arrives one byte every `seconds`: it never times out a read, yet never ends soon."""

    def write(wfile) -> None:
        for i in range(len(body)):
            wfile.write(body[i : i + 1])
            wfile.flush()
            time.sleep(seconds)

    return lambda seen: (200, {"Content-Type": content_type, "Content-Length": str(len(body))}, write)
