"""`batch_runner.py serve`: the rollouts over HTTP, for a trainer in another process or language (docs/rollouts.md).

`POST /v1/rollouts` with `{"tasks": [...], "samples_per_prompt": N, "model"?, "base_url"?, "policy_version"?}`
answers 200 `application/x-ndjson`, chunked: one line per group as it finishes, `{"index", "task",
"samples": [{"sample", "status", "error", "record", "reward", "tokens"}]}`, then `{"done": true, "groups": n,
"failed": m}` (m: samples that failed); a line `{"error": ...}` ends a stream the rollouts could not finish.
`GET /health` answers `{"status": "ok"}`. Every request needs `Authorization: Bearer <token>` with the token
from BATCH_RUNNER_TOKEN (401 otherwise); without it set the server does not start, on loopback too: any local
user could otherwise spend the endpoint's money and run commands in its sandboxes. A bad request gets a 400
with one line `{"error": ...}`. A client that disconnects cancels its call: samples not started never start,
running ones end at their next model call or tool and their sandboxes are removed.

One Rollouts serves every request (its workers, sandboxes and model kept between them); each request is a
thread of the standard library's ThreadingHTTPServer, so requests overlap.
"""

from __future__ import annotations

import hmac
import json
import os
import select
import socket
import sys
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentbatch.errors import FatalError
from agentbatch.rollouts import Groups, Rollouts, RolloutsError

TOKEN_VARIABLE = "BATCH_RUNNER_TOKEN"
MAX_BODY_BYTES = 64 * 1024 * 1024
# How often a stream waiting for its next group looks whether its client is still there.
CLIENT_CHECK_SECONDS = 0.25
REQUEST_KEYS = ("tasks", "samples_per_prompt", "model", "base_url", "policy_version")


class BadRequest(Exception):
    """What makes a request a 400: its one line."""


def serve(values: Mapping[str, Any]) -> int:
    """Serve the rollouts until interrupted (Ctrl-C, SIGTERM); the run's flags as for a CLI run."""
    token = os.environ.get(TOKEN_VARIABLE) or None  # read before the Runtime withdraws it with the credentials
    if token is None:
        raise FatalError(
            f"serve needs {TOKEN_VARIABLE}, the token every request must carry as 'Authorization: Bearer <token>'"
            f" (on loopback too); e.g. {TOKEN_VARIABLE}=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    rollouts = Rollouts(**values)
    host, port = rollouts.settings.serve.host, rollouts.settings.serve.port
    with rollouts:
        httpd = ThreadingHTTPServer((host, port), Handler)
        httpd.daemon_threads = True
        httpd.rollouts, httpd.token = rollouts, token  # type: ignore[attr-defined]
        where = f"http://{httpd.server_address[0]}:{httpd.server_address[1]}"
        print(
            f"serving rollouts on {where}/v1/rollouts (every request needs its bearer token); Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )
        try:
            httpd.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            httpd.server_close()
    return 0


def parse_request(body: bytes) -> dict:
    """The request's fields, checked for their JSON types (their values are the Rollouts' to check)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(request, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(request) - set(REQUEST_KEYS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; the fields: {', '.join(REQUEST_KEYS)}")
    if not isinstance(request.get("tasks"), list):
        raise BadRequest('"tasks" must be a list of tasks')
    for name in ("model", "base_url", "policy_version"):
        if name in request and not isinstance(request[name], str):
            raise BadRequest(f'"{name}" must be a string')
    return request


class Handler(BaseHTTPRequestHandler):
    """One request; the server holds the Rollouts and the token."""

    protocol_version = "HTTP/1.1"
    server_version = "batch-runner"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the standard library's name)
        pass  # no access log: a request line holds nothing the operator asked for

    def do_GET(self) -> None:
        if not self._authorized():
            return
        if self.path != "/health":
            return self._reply(404, {"error": f"no such endpoint: GET {self.path}"})
        self._reply(200, {"status": "ok"})

    def do_POST(self) -> None:
        if not self._authorized():
            return
        if self.path != "/v1/rollouts":
            return self._reply(404, {"error": f"no such endpoint: POST {self.path}"})
        try:
            request = parse_request(self._body())
            changes = {k: request[k] for k in ("model", "base_url", "policy_version") if k in request}
            groups = self.server.rollouts.run(request["tasks"], request.get("samples_per_prompt"), **changes)
        except (BadRequest, FatalError) as e:
            return self._reply(400, {"error": str(e)})
        with groups:
            self._stream(groups)

    def _authorized(self) -> bool:
        token = self.server.token
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return True
        self._reply(401, {"error": "unauthorized: send Authorization: Bearer <the server's token>"})
        return False

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise BadRequest("a Content-Length is needed")
        if int(length) > MAX_BODY_BYTES:
            raise BadRequest(f"the body is over {MAX_BODY_BYTES} bytes")
        return self.rfile.read(int(length))

    def _reply(self, status: int, doc: dict) -> None:
        body = (json.dumps(doc) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, groups: Groups) -> None:
        """Each group's line as it finishes, the last line, or the client gone: the call cancelled (by `with`)."""
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        count = 0
        try:
            while True:
                try:
                    group = groups.next_within(CLIENT_CHECK_SECONDS)
                except StopIteration:
                    break
                if group is None:
                    if self._client_gone():
                        return
                    continue
                self._chunk(group_line(group))
                count += 1
            self._chunk({"done": True, "groups": count, "failed": groups.failed})
        except RolloutsError as e:
            self._chunk({"error": str(e)})
        except OSError:  # the client went away while a line was sent
            return
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _chunk(self, doc: dict) -> None:
        data = (json.dumps(doc, ensure_ascii=False) + "\n").encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """Whether the client closed its end (a readable socket with nothing to read)."""
        sock = self.connection
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


def group_line(group) -> dict:
    """A group as its stream line."""
    return {
        "index": group.index,
        "task": group.task,
        "samples": [
            {
                "sample": s.sample,
                "status": s.status,
                "error": s.error,
                "record": s.record,
                "reward": s.reward,
                "tokens": s.tokens,
            }
            for s in group.samples
        ],
    }
