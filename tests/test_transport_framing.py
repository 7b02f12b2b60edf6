"""The reply's framing from a hostile endpoint: sizes that lie, bodies of a gigabyte, endless trailers.

Each is a malformed reply, retried, and refused before it takes the worker's memory; a fuzz test holds the
parser to h11's reading of the same bytes (h11 is the parser under httpx).
"""

from __future__ import annotations

import io
import json
import threading
import time

import h11
import psutil
import pytest
from cli_helpers import RunDir, run_cli, write_dataset
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from raw_server import RawServer

from agentbatch.model import transport
from agentbatch.model.client import ModelCallError, ModelClient, ModelSettings

MIB = 1 << 20
GIB = 1 << 30
# What the kernel's socket buffers and the reader's own buffer can take in before the client stops reading.
MOST_SENT = 64 * MIB
CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
BLOCK = b"x" * MIB


def _forever(piece: bytes, total: int = GIB):
    """`piece` repeated in blocks of about 1 MiB until `total` bytes."""
    block = piece * max(1, MIB // len(piece))
    for _ in range(total // len(block)):
        yield block


def _valid_chunks():
    for _ in range(GIB // MIB):
        yield b"%x\r\n%s\r\n" % (MIB, BLOCK)


# name -> (what the server sends after reading the request, as blocks)
HOSTILE = {
    "chunk size -1, then 1 GB": lambda: [CHUNKED, b"-1\r\n", *_forever(b"x")],
    "chunk size +10": lambda: [CHUNKED, b"+10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"],
    "chunk size 0x10": lambda: [CHUNKED, b"0x10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"],
    "chunk size 1_0": lambda: [CHUNKED, b"1_0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"],
    "chunk size of 2**60": lambda: [CHUNKED, b"fffffffffffffff\r\n", *_forever(b"x")],
    "chunk size of 40 digits": lambda: [CHUNKED, b"1" * 40 + b"\r\n", *_forever(b"x")],
    "a chunk size line that never ends": lambda: [CHUNKED, *_forever(b"1")],
    "a chunk longer than its size": lambda: [CHUNKED, b"2\r\n{}{}{}\r\n0\r\n\r\n"],
    "1 GB in valid chunks": lambda: [CHUNKED, *_valid_chunks()],
    "endless trailers": lambda: [CHUNKED, b"2\r\n{}\r\n0\r\n", *_forever(b"X-Trailer: y\r\n")],
    "a trailer line of 1 GB": lambda: [CHUNKED, b"2\r\n{}\r\n0\r\nX-Trailer: ", *_forever(b"y")],
    "Content-Length -1": lambda: [b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", *_forever(b"x")],
    "Content-Length +2": lambda: [b"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\n{}"],
    "Content-Length in Arabic digits": lambda: [
        b"HTTP/1.1 200 OK\r\nContent-Length: " + "\u0662".encode() + b"\r\n\r\n{}"
    ],
    "Content-Length of 1 GB": lambda: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % GIB, *_forever(b"x")],
    "1 GB until the close": lambda: [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n", *_forever(b"x")],
    "endless headers": lambda: [b"HTTP/1.1 200 OK\r\n", *_forever(b"X-Header: y\r\n")],
    "endless 100 Continue": lambda: [*_forever(b"HTTP/1.1 100 Continue\r\n\r\n")],
    "a status of \u00b200": lambda: ["HTTP/1.1 \u00b200 OK\r\nContent-Length: 2\r\n\r\n{}".encode()],
}


class Hostile(RawServer):
    """Answers every request with the same hostile reply, and counts the bytes each connection took."""

    def __init__(self, reply):
        self.sent: list[int] = []
        self.lock = threading.Lock()

        def answer(server, conn, reader, index):
            while server.read_request(reader) is not None:
                sent = 0
                try:
                    for block in reply():
                        conn.sendall(block)
                        sent += len(block)
                finally:
                    with self.lock:
                        self.sent.append(sent)

        super().__init__(answer)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_framing_is_a_malformed_reply_retried_and_never_read_whole(case):
    server = Hostile(HOSTILE[case])
    model = ModelSettings(
        model="m",
        base_url=f"http://127.0.0.1:{server.port}/v1",
        api_key="k",
        max_retries=1,
        request_timeout=60,
        retry_base_delay=0.05,
    )
    try:
        with pytest.raises(ModelCallError) as raised:
            ModelClient(model).chat([{"role": "user", "content": "hi"}])
    finally:
        server.close()
    message = str(raised.value)
    assert message.startswith("malformed reply: ") and message.endswith("(after 2 attempts)"), message
    assert len(server.requests) == 2
    time.sleep(0.2)  # the server's last send fails once the client has closed the connection
    assert max(server.sent) < MOST_SENT, f"the client read on to {max(server.sent) / MIB:.0f} MiB"


def test_hostile_framings_through_the_cli_fail_their_prompts_as_malformed_replies_in_bounded_memory(tmp_path):
    cases = ["chunk size -1, then 1 GB", "1 GB in valid chunks", "endless trailers", "1 GB until the close"]

    def answer(server, conn, reader, index):
        while (request := server.read_request(reader)) is not None:
            body = json.loads(request.partition(b"\r\n\r\n")[2])
            prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
            for block in HOSTILE[prompt]():
                conn.sendall(block)

    server = RawServer(answer)
    data = write_dataset(tmp_path / "d.jsonl", cases)
    args = [
        f"--dataset_file={data}",
        "--batch_size=4",
        "--run_name=hostile",
        f"--output_dir={tmp_path / 'out'}",
        f"--base_url=http://127.0.0.1:{server.port}/v1",
        "--api_key=k",
        "--model=m",
        "--max_retries=1",
        "--request_timeout=120",
        "--num_workers=2",
        "--sandbox=local",
        "--distribution=minimal",
    ]
    peak = [0]
    done = threading.Event()

    def sample():
        me = psutil.Process()
        while not done.wait(0.05):
            rss = 0
            for p in me.children(recursive=True):
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        proc = run_cli(args, tmp_path)
    finally:
        done.set()
        sampler.join()
        server.close()
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    failed = {f["prompt"]: f["error"] for f in RunDir(tmp_path / "out" / "hostile").failed()}
    assert sorted(failed) == sorted(cases), proc.stderr
    for prompt, error in failed.items():
        assert error.startswith("malformed reply: ") and "(after 2 attempts)" in error, (prompt, error)
    assert len(server.requests) == 2 * len(cases)
    assert peak[0] < 1 * GIB, f"the runner's processes grew to {peak[0] / MIB:.0f} MiB"


# ----- the parser against h11's reading of the same bytes -------------------------------------------------

CAP = 64


def ours(data: bytes):
    """(status, body) or the exception class; no other exception may escape."""
    try:
        response, _ = transport.read_response(io.BufferedReader(io.BytesIO(data), 256), CAP)
    except (transport.BadReply, ConnectionError) as e:
        return type(e)
    assert len(response.content) <= CAP
    return response.status_code, response.content


def h11s(data: bytes):
    """(status, body) as h11 reads the bytes after a POST, or None when it finds them broken or incomplete."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    status, body = None, b""
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, body
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return None
    except h11.RemoteProtocolError:
        return None


_SIZES = st.one_of(
    st.integers(0, 40).map(lambda n: b"%x" % n),
    st.integers(0, 40).map(lambda n: b"%X" % n),
    st.sampled_from([b"-1", b"+5", b"0x5", b"1_0", b" 5", b"5 ", b"", b"g", b"fffffffffffffffffff", "\u0665".encode()]),
)
_LENGTHS = st.one_of(
    st.integers(0, 100).map(lambda n: b"%d" % n),
    st.sampled_from([b"-1", b"+5", b"1_0", b" 5 ", b"5, 5", b"", b"1e2", "\u0665".encode(), b"99999999999999999999"]),
)


@st.composite
def replies(draw) -> bytes:
    """A reply built from framing parts, right or wrong, then perhaps cut or with a byte changed."""
    data = b""
    for _ in range(draw(st.integers(0, 2))):
        data += b"HTTP/1.1 100 Continue\r\n\r\n"
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2", b"HTTP/1.1 "]))
    status = draw(st.sampled_from([b"200", b"500", b"204", b"2000", b"20", "\u00b200".encode()]))
    reason = draw(st.sampled_from([b" OK", b"", b" Not Found Here", b"\tOK"]))
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    data += version + b" " + status + reason + eol
    body = draw(st.binary(max_size=100))
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    headers = [draw(st.sampled_from([b"Content-Type: application/json", b"X-Odd:", b"Server: t"]))]
    if framing == "length":
        headers.append(b"Content-Length: " + draw(st.one_of(st.just(b"%d" % len(body)), _LENGTHS)))
    elif framing == "chunked":
        headers.append(draw(st.sampled_from([b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked"])))
        pieces, rest = [], body
        while rest:
            n = draw(st.integers(1, len(rest)))
            size = draw(st.one_of(st.just(b"%x" % n), _SIZES))
            ext = draw(st.sampled_from([b"", b";name=value", b" ", b";x\x00y"]))
            pieces.append(size + ext + eol + rest[:n] + draw(st.sampled_from([eol, b"", b"zz\r\n"])))
            rest = rest[n:]
        trailers = draw(st.lists(st.sampled_from([b"X-T: 1", b"Bad Trailer", b"X-T:" + b"y" * 300]), max_size=3))
        body = b"".join(pieces) + b"0" + eol + b"".join(t + eol for t in trailers) + eol
    if draw(st.booleans()):
        headers.append(draw(st.sampled_from([b"Connection: close", b" folded", b"No colon", b":empty name"])))
    data += b"".join(h + eol for h in headers) + eol + body
    change = draw(st.sampled_from(["none", "cut", "byte"]))
    if change == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif change == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    return data


# Derandomized: the same examples on every run, so the suite's verdict does not depend on the day's draw.
@settings(max_examples=3000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(replies())
@example(b"HTTP/1.1 204 OK\r\nContent-Type: application/json\r\nContent-Length: 99999999999999999999\r\n\r\n")
def test_the_parser_reads_what_h11_reads_and_refuses_the_rest(data):
    mine, theirs = ours(data), h11s(data)
    if isinstance(mine, tuple):
        # Whatever it accepts, h11 reads the same way: nothing it takes is a guess of its own.
        assert theirs is not None, (data, mine)
        assert mine == theirs, (data, mine, theirs)
    elif theirs is not None and len(theirs[1]) <= CAP:
        # What h11 reads, it reads too, unless the reply leaves the form servers send (see the cases below).
        assert mine is not None and _stricter_by_design(data), (data, mine, theirs)


def _stricter_by_design(data: bytes) -> bool:
    """h11 takes a repeated Content-Length of one value; the parser refuses it: no endpoint sends one, and a
    list of lengths is how a smuggled body hides from some parser."""
    return b"5, 5" in data
