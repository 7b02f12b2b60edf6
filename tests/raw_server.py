"""A TCP server on 127.0.0.1 that answers with whatever bytes a test writes: replies no HTTP library would send."""

from __future__ import annotations

import socket
import threading


class RawServer:
    """A TCP server on 127.0.0.1 whose every connection is handled by `handle(sock, reader, index)`."""

    def __init__(self, handle):
        self.handle = handle
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.connections), daemon=True).start()

    def _serve(self, conn: socket.socket, index: int) -> None:
        with conn, conn.makefile("rb") as reader:
            try:
                self.handle(self, conn, reader, index)
            except OSError:
                pass

    def read_request(self, reader) -> bytes | None:
        """One request (head and body) from the connection; None when the client closed it."""
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            line = reader.readline()
            if not line:
                return None
            head += line
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
            0,
        )
        request = head + reader.read(length)
        self.requests.append(request)
        return request

    def close(self) -> None:
        self.sock.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )
