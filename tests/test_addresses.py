"""An endpoint's name is looked up once for the hundreds of connections a run opens, and again when it moves.

The resolver is this module's (socket.getaddrinfo replaced, counting the questions), the servers and the
connections to them are real.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from test_transport import RawServer, ok

from agentbatch.model import addresses
from agentbatch.model.client import ModelCallError, ModelClient, ModelSettings


def answering(content: str):
    reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}

    def handle(server, conn, reader, index):
        while server.read_request(reader) is not None:
            conn.sendall(ok(json.dumps(reply).encode()))

    return handle


class Resolver:
    """Names to ports on 127.0.0.1; counts the questions, and can fail the next ones."""

    def __init__(self, monkeypatch, names: dict[str, int], delay: float = 0.0):
        self.names, self.delay, self.asked, self.failing = names, delay, [], 0
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            if host not in self.names:
                return real(host, port, *args, **kwargs)
            self.asked.append(host)
            time.sleep(self.delay)  # a real lookup takes a while: the other threads ask meanwhile
            if self.failing:
                self.failing -= 1
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", self.names[host]))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def client(host: str, retries: int = 0) -> ModelClient:
    return ModelClient(ModelSettings(model="m", base_url=f"http://{host}/v1", api_key="k", max_retries=retries))


def ask(c: ModelClient) -> str:
    return c.chat([{"role": "user", "content": "hi"}]).choices[0].message.content


def test_sessions_starting_together_ask_the_resolver_once(monkeypatch):
    server = RawServer(answering("hello"))
    resolver = Resolver(monkeypatch, {"many.test": server.port}, delay=0.05)
    c = client("many.test")
    answers: list[str] = []
    threads = [threading.Thread(target=lambda: answers.append(ask(c))) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == ["hello"] * 64 and server.connections == 64  # a connection per thread, as before
    assert resolver.asked == ["many.test"]


def test_an_endpoint_that_moved_is_looked_up_again(monkeypatch):
    old, new = RawServer(answering("old")), RawServer(answering("new"))
    resolver = Resolver(monkeypatch, {"moving.test": old.port})
    c = client("moving.test", retries=2)
    assert ask(c) == "old"
    old.sock.shutdown(socket.SHUT_RDWR)  # wakes its accept, so the port stops taking connections
    old.close()
    resolver.names["moving.test"] = new.port
    # The kept address no longer answers: the call's retry asks the resolver again and reaches the new one.
    fresh = client("moving.test", retries=2)
    assert ask(fresh) == "new"
    assert resolver.asked == ["moving.test", "moving.test"]


def test_a_failed_lookup_fails_the_call_and_is_not_kept(monkeypatch):
    server = RawServer(answering("back"))
    resolver = Resolver(monkeypatch, {"flaky.test": server.port})
    resolver.failing = 1
    with pytest.raises(ModelCallError, match="connection failed or dropped"):
        ask(client("flaky.test"))
    assert ask(client("flaky.test")) == "back"
    assert resolver.asked == ["flaky.test", "flaky.test"]


def test_an_answer_is_kept_for_a_while_then_asked_again(monkeypatch):
    server = RawServer(answering("hi"))
    resolver = Resolver(monkeypatch, {"kept.test": server.port})
    assert ask(client("kept.test")) == "hi" and ask(client("kept.test")) == "hi"
    assert resolver.asked == ["kept.test"]
    monkeypatch.setattr(addresses, "KEEP_SECONDS", 0.0)
    addresses.forget("kept.test", 80)
    assert ask(client("kept.test")) == "hi" and ask(client("kept.test")) == "hi"
    assert resolver.asked == ["kept.test"] * 3
