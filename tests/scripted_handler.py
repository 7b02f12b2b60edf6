"""The scripted server's HTTP side: one request handler routing each request to its ScriptedServer
(scripted_server.py documents the routes, the script format and the faults)."""

from __future__ import annotations

import base64
import json
import re
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from scripted_replies import (
    DEFAULT_USAGE,
    MALFORMED_BODY,
    MODEL_ID,
    PNG_BYTES,
    add_token_ids,
    build_logprobs,
    build_message,
    error_body,
    prompt_of,
)

if TYPE_CHECKING:
    from scripted_server import ScriptedServer

_IMAGE_PATH = re.compile(r"^/images/(\d+)\.png$")


class HTTPServer(ThreadingHTTPServer):
    """Threading server tuned for many concurrent keep-alive clients."""

    daemon_threads = True
    # Joining handler threads on close would hang on idle keep-alive clients.
    block_on_close = False
    request_queue_size = 1024
    allow_reuse_address = True
    owner: ScriptedServer

    def handle_error(self, request, client_address):
        """Stay quiet: client disconnects are expected under fault injection."""


class Handler(BaseHTTPRequestHandler):
    """Routes requests to the owning ScriptedServer."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate sends; with Nagle on, delayed ACKs
    # would add ~40 ms to every keep-alive response.
    disable_nagle_algorithm = True
    server: HTTPServer
    _responded = False

    def log_message(self, format, *args):
        """Keep stderr clean; benchmarks issue thousands of requests."""

    def setup(self):
        """Register the connection so stop() can unblock idle keep-alive reads."""
        super().setup()
        self.server.owner._track(self.connection, True)

    def finish(self):
        """Unregister the connection."""
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, False)

    # -- plumbing ---------------------------------------------------------

    def _read_body(self) -> bytes:
        """Read a Content-Length or chunked request body."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_raw(self, status: int, body: bytes, ctype: str, headers: dict | None = None):
        """Send a complete response with Content-Length so keep-alive works."""
        self._responded = True
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _send_trickle(self, body: bytes, seconds: float):
        """Send a 200 reply whose body arrives one byte at a time, `seconds` apart."""
        self._responded = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        for i in range(len(body)):
            if self.server.owner._stopping.wait(seconds):
                return self._drop()
            self.wfile.write(body[i : i + 1])
            self.wfile.flush()

    def _send_json(self, status: int, obj, headers: dict | None = None):
        """Send a JSON response."""
        self._send_raw(status, json.dumps(obj).encode(), "application/json", headers)

    def _drop(self):
        """Close the socket without writing any response."""
        self._responded = True
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _dispatch(self, method: str):
        """Run one route, turning bad input into 400 and bugs into 500."""
        self._responded = False
        try:
            body = self._read_body() if method == "POST" else b""
        except (ValueError, OSError):
            self.close_connection = True
            self._send_json(400, error_body(400, "could not read request body"))
            return
        try:
            self._route(method, self.path.split("?", 1)[0], body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - one bad request must not kill the server
            if self._responded:
                self.close_connection = True
                return
            try:
                self._send_json(500, error_body(500, f"{type(exc).__name__}: {exc}"))
            except OSError:
                self.close_connection = True

    def do_GET(self):
        """Handle GET."""
        self._dispatch("GET")

    def do_POST(self):
        """Handle POST."""
        self._dispatch("POST")

    # -- routes -----------------------------------------------------------

    def _route(self, method: str, path: str, raw: bytes):
        """Map (method, path) to a handler."""
        owner = self.server.owner
        path = path.rstrip("/") or "/"
        if method == "GET":
            if path in ("/v1/models", "/models"):
                model = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "scripted"}
                return self._send_json(200, {"object": "list", "data": [model]})
            if path == "/_requests":
                return self._send_json(200, owner.requests())
            if path == "/_image_requests":
                return self._send_json(200, owner.image_requests())
            if path == "/_faults":
                return self._send_json(200, owner.fault_rates())
            if path == "/_rate":
                return self._send_json(200, owner.rate_limit.stats() if owner.rate_limit else {})
            if _IMAGE_PATH.match(path):
                return self._send_raw(200, PNG_BYTES, "image/png")
            return self._send_json(404, error_body(404, f"no route GET {path}"))
        routes = {
            "/v1/chat/completions": self._chat,
            "/chat/completions": self._chat,
            "/v1/images/generations": self._images,
            "/images/generations": self._images,
            "/_faults": self._faults,
        }
        if path not in routes:
            return self._send_json(404, error_body(404, f"no route POST {path}"))
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return self._send_json(400, error_body(400, "request body is not valid JSON"))
        if not isinstance(body, dict):
            return self._send_json(400, error_body(400, "request body must be a JSON object"))
        return routes[path](body)

    def _faults(self, body: dict):
        """Replace the global fault rates."""
        self.server.owner.set_fault_rates(body)
        self._send_json(200, self.server.owner.fault_rates())

    def _images(self, body: dict):
        """Answer an image generation request with a tiny PNG."""
        owner = self.server.owner
        owner._record_image(body)
        count = max(1, int(body.get("n") or 1))
        data = []
        for _ in range(count):
            if body.get("response_format") == "b64_json":
                data.append({"b64_json": base64.b64encode(PNG_BYTES).decode()})
            else:
                n = next(owner._image_ids)
                data.append({"url": f"http://127.0.0.1:{owner.port}/images/{n}.png"})
        self._send_json(200, {"created": int(time.time()), "data": data})

    def _send_fault(self, fault: str, spec: dict):
        """Send (or, for "drop", withhold) the response for an error fault."""
        message = spec.get("error_message")
        if fault == "drop":
            return self._drop()
        if fault == "malformed":
            return self._send_raw(200, MALFORMED_BODY, "application/json")
        if fault == "context_length":
            message = message or (
                "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 12000 tokens. Please reduce the length of the messages."
            )
            err = error_body(400, message, code="context_length_exceeded")
            err["error"]["param"] = "messages"
            return self._send_json(400, err)
        if not fault.isdigit():
            raise ValueError(f"unknown fault {fault!r}")
        status = int(fault)
        headers = {}
        code = None
        if status == 429:
            headers["Retry-After"] = str(spec.get("retry_after", "1"))
            code = "rate_limit_exceeded"
            message = message or "Rate limit reached (injected fault)."
        message = message or f"Injected fault: HTTP {status}."
        self._send_json(status, error_body(status, message, code=code), headers)

    def _chat(self, body: dict):
        """Answer a chat completion from the script, applying faults and latency."""
        owner = self.server.owner
        owner._record_chat(body, {k.lower(): v for k, v in self.headers.items()})
        prompt = prompt_of(body)
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        spec = owner._spec_for(prompt, turn)
        limit_headers: dict = {}
        if owner.rate_limit is not None:
            accepted, limit_headers = owner.rate_limit.take()
            if not accepted:
                message = "Rate limit reached for requests (scripted rate limit)."
                return self._send_json(429, error_body(429, message, code="rate_limit_exceeded"), limit_headers)

        global_fault = owner._roll_fault()
        if global_fault == "slow":
            owner._sleep(owner.slow_seconds)
        elif global_fault:
            return self._send_fault(global_fault, {})

        fault = spec.get("fault")
        if fault is not None and owner._take_fault((prompt, turn), spec.get("fault_times", 1)):
            fault = str(fault)
            if fault != "slow":
                return self._send_fault(fault, spec)
            owner._sleep(float(spec.get("slow_seconds", 30)))

        owner._sleep(float(spec["latency"]) if "latency" in spec else owner.draw_latency())
        if owner._stopping.is_set():
            return self._drop()
        if "raw" in spec:
            reply = spec["raw"].encode("utf-8", "surrogatepass")
        else:
            msg, finish = build_message(spec, turn)
            choice = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}
            if body.get("logprobs"):  # as real servers do: log probabilities only when asked for
                choice["logprobs"], token_ids = build_logprobs(spec, msg.get("content"))
                if token_ids is not None:
                    choice["token_ids"] = token_ids
            built = {
                "id": f"chatcmpl-scripted-{next(owner._completion_ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or MODEL_ID,
                "choices": [choice],
                "usage": spec.get("usage") or dict(DEFAULT_USAGE),
                "system_fingerprint": None,
            }
            if body.get("return_token_ids"):
                add_token_ids(built, body, spec)
            reply = json.dumps(built).encode()
        if "trickle_seconds" in spec:
            return self._send_trickle(reply, float(spec["trickle_seconds"]))
        self._send_raw(200, reply, "application/json", limit_headers)
