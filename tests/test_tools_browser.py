"""The browser toolset in a real headless Chromium against pages served on 127.0.0.1."""

from __future__ import annotations

import base64
import contextlib
import html
import ipaddress
import json
import os
import re
import signal
import socket
import threading
import time
from dataclasses import replace
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from fake_site import FakeSite, html_reply
from helpers import make_ctx as context
from scripted_server import PNG_BYTES, ScriptedServer

from agentbatch.limits import PromptLimits, SampleLimits
from agentbatch.tools import browser as tools_browser
from agentbatch.tools import browser_session
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings, from_environment

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        browser_session.unavailable_reason(ToolSettings().browser_executable) is not None,
        reason="Chromium or Playwright missing",
    ),
]

FIXTURES = Path(__file__).parent / "fixtures" / "browser"
STALL = threading.Event()


class _Handler(SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=str(FIXTURES), **kwargs)

    def log_message(self, format, *args):
        pass

    def do_GET(self):
        parts = urlsplit(self.path)
        if parts.path == "/pixel.png":
            time.sleep(float(parse_qs(parts.query).get("delay", ["0"])[0]))  # an image that takes its time
            return self._send(200, PNG_BYTES, "image/png")
        if parts.path == "/slow-images":
            slow = '<img src="/pixel.png?delay=1" alt="slow"><img src="/pixel.png?delay=8" alt="too slow">'
            return self._page("Slow gallery", slow)
        if parts.path == "/search":
            q = parse_qs(parts.query).get("q", [""])[0]
            return self._page("Search results", f"<p>Results for {html.escape(q)}</p>")
        if parts.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(parts.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if parts.path == "/stall":
            # Headers and a first chunk, then nothing: the document never finishes parsing.
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(b"<html><head><title>Stalled</title></head><body><p>loading" + b" " * 2048)
            self.wfile.flush()
            STALL.wait(60)
            return
        return super().do_GET()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        form = {k: v[0] for k, v in parse_qs(body).items()}
        self._page(
            "Thanks",
            f"<h1>Thanks, {html.escape(form.get('name', '?'))}!</h1>"
            f"<p>Colour: {html.escape(form.get('colour', '?'))}</p>"
            f"<p>Subscribed: {form.get('subscribe', 'no')}</p><p>Note: {html.escape(form.get('note', ''))}</p>",
        )

    def _page(self, title: str, body: str):
        page = f"<!doctype html><html><head><title>{title}</title></head><body>{body}</body></html>"
        self._send(200, page.encode(), "text/html; charset=utf-8")

    def _send(self, status: int, data: bytes, ctype: str):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    STALL.set()
    server.shutdown()
    server.server_close()


def make_ctx(base_url="http://127.0.0.1:9/v1", model="main-model", api_key="test-key", **settings) -> ToolContext:
    settings.setdefault("allow_private_urls", True)
    settings.setdefault("command_timeout", 10)
    return context(from_environment(os.environ, **settings), base_url=base_url, model=model, api_key=api_key)


@pytest.fixture
def ctx():
    c = make_ctx()
    yield c
    c.close()


def call(ctx: ToolContext, name: str, **args) -> dict:
    result, success = call_tool(load_tools()[name], json.dumps(args), ctx)
    out = json.loads(result)
    assert success == (not out.get("error")), out
    return out


def ok(ctx: ToolContext, name: str, **args) -> dict:
    out = call(ctx, name, **args)
    assert not out["error"], out
    return out


def ref_of(snapshot: str, pattern: str) -> str:
    """The ref on the snapshot line element matching pattern (e.g. 'textbox "Full name"')."""
    match = re.search(r"\[(e\d+)\] " + pattern, snapshot)
    assert match, f"{pattern!r} not in snapshot:\n{snapshot}"
    return match.group(1)


def live_chromium_pids() -> set[int]:
    """Running (not zombie) Chromium processes, read from /proc."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            exe = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if b"chrom" in exe and stat[stat.rfind(")") + 2] not in "ZX":
            pids.add(int(name))
    return pids


def leftover_chromium(before: set[int]) -> set[int]:
    """Chromium processes started since before that are still running after a short grace (a kill is async)."""
    deadline = time.monotonic() + 5
    while (left := live_chromium_pids() - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_fill_and_submit_a_form_then_read_the_result_page(ctx, site):
    nav = ok(ctx, "browser_navigate", url=f"{site}/form.html")
    assert nav["title"] == "Sign-up form" and nav["status"] == 200
    snap = ok(ctx, "browser_snapshot")["snapshot"]
    assert snap.startswith("Title: Sign-up form\nURL: ")
    assert "# Join the newsletter" in snap
    ok(ctx, "browser_type", ref=ref_of(snap, 'textbox "Full name"'), text="Ada Lovelace")
    ok(ctx, "browser_type", ref=ref_of(snap, 'select "Colour'), text="Green")
    ok(ctx, "browser_click", ref=ref_of(snap, 'checkbox "Subscribe"'))
    ok(ctx, "browser_type", ref=ref_of(snap, 'textarea "Note"'), text="first line")
    again = ok(ctx, "browser_snapshot")["snapshot"]
    assert 'value="Ada Lovelace"' in again and "Green*" in again and 'checkbox "Subscribe" checked' in again
    clicked = ok(ctx, "browser_click", ref=ref_of(snap, 'button "Send"'))
    assert clicked["title"] == "Thanks" and clicked["url"].endswith("/submit")
    result = ok(ctx, "browser_snapshot")["snapshot"]
    assert "# Thanks, Ada Lovelace!" in result
    assert "Colour: Green" in result and "Subscribed: yes" in result and "Note: first line" in result


def test_type_with_submit_presses_enter(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/form.html")
    snap = ok(ctx, "browser_snapshot")["snapshot"]
    out = ok(ctx, "browser_type", ref=ref_of(snap, 'textbox "Search"'), text="chromium tips", submit=True)
    assert out["title"] == "Search results" and "q=chromium+tips" in out["url"]
    assert "Results for chromium tips" in ok(ctx, "browser_snapshot")["snapshot"]


def test_refs_survive_scrolling_and_stale_refs_are_refused(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/long.html")
    first = ok(ctx, "browser_snapshot")
    assert first["element_count"] == 150
    far = ref_of(first["snapshot"], 'link "Item 140"')
    near = ref_of(first["snapshot"], 'link "Item 3"')
    positions = [ok(ctx, "browser_scroll", direction="down")["scroll_y"] for _ in range(3)]
    assert positions == sorted(positions) and positions[-1] > 1000
    second = ok(ctx, "browser_snapshot")["snapshot"]
    assert ref_of(second, 'link "Item 140"') == far and ref_of(second, 'link "Item 3"') == near
    more = ref_of(second, 'button "Load more"')  # appeared on scroll: a fresh ref, not a reused one
    assert int(more[1:]) > max(int(far[1:]), int(near[1:]))
    assert ok(ctx, "browser_scroll", direction="up")["scroll_y"] < positions[-1]
    assert ok(ctx, "browser_click", ref=far)["url"].endswith("#item-140")
    assert ok(ctx, "browser_click", ref=more)["title"] == "More loaded"

    ok(ctx, "browser_navigate", url=f"{site}/page2.html")
    stale = call(ctx, "browser_click", ref=far)
    assert "stale" in stale["error"] and far in stale["error"]
    assert "e12" in call(ctx, "browser_type", ref="nonsense", text="x")["error"]


def test_back_navigation(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/form.html")
    no_history = call(ctx, "browser_back")
    assert "no previous page" in no_history["error"]
    snap = ok(ctx, "browser_snapshot")["snapshot"]
    assert ok(ctx, "browser_click", ref=ref_of(snap, 'link "Go to page two"'))["title"] == "Page two"
    back = ok(ctx, "browser_back")
    assert back["title"] == "Sign-up form" and back["url"].endswith("/form.html")
    assert "# Join the newsletter" in ok(ctx, "browser_snapshot")["snapshot"]


def test_press_a_key(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/form.html")
    snap = ok(ctx, "browser_snapshot")["snapshot"]
    ok(ctx, "browser_click", ref=ref_of(snap, 'textbox "Search"'))
    for key in ("h", "i", "Enter"):
        ok(ctx, "browser_press", key=key)
    assert "Results for hi" in ok(ctx, "browser_snapshot")["snapshot"]
    assert "Unknown key" in call(ctx, "browser_press", key="NoSuchKey")["error"]


def test_a_page_that_never_loads_fails_within_the_timeout_and_the_browser_still_works(site):
    ctx = make_ctx(command_timeout=3)
    try:
        ok(ctx, "browser_navigate", url=f"{site}/page2.html")
        start = time.monotonic()
        stalled = call(ctx, "browser_navigate", url=f"{site}/stall")
        assert time.monotonic() - start < 3 + browser_session.HANG_GRACE
        assert "Timeout" in stalled["error"]
        assert ok(ctx, "browser_navigate", url=f"{site}/form.html")["title"] == "Sign-up form"
        assert "# Join the newsletter" in ok(ctx, "browser_snapshot")["snapshot"]
    finally:
        ctx.close()


def test_a_hung_renderer_is_killed_and_the_next_call_relaunches(site, monkeypatch):
    monkeypatch.setattr(browser_session, "HANG_GRACE", 2.0)
    ctx = make_ctx(command_timeout=3)
    try:
        ok(ctx, "browser_navigate", url=f"{site}/spin.html")
        time.sleep(1)  # the page's script loop has started
        start = time.monotonic()
        hung = call(ctx, "browser_snapshot")
        assert time.monotonic() - start < 3 + 2 + 5
        assert "did not respond" in hung["error"]
        back = ok(ctx, "browser_navigate", url=f"{site}/page2.html")
        assert back["title"] == "Page two" and "restarted" in back["note"]
    finally:
        ctx.close()


def test_the_prompts_time_limit_cuts_a_hanging_page_and_a_hung_renderer(site):
    ctx = make_ctx(command_timeout=60)  # without the prompt's limit: 30 s a navigation, 40 s a hang
    try:
        ok(ctx, "browser_navigate", url=f"{site}/page2.html")  # the browser starts before the clock does
        ctx.limits = SampleLimits(PromptLimits(seconds=3))
        start = time.monotonic()
        stalled = call(ctx, "browser_navigate", url=f"{site}/stall")
        assert time.monotonic() - start < 3 + 5, "generous for a loaded machine, far below 30 s"
        cut = re.search(r"Timeout (\d+)ms exceeded", stalled["error"])
        assert cut and int(cut.group(1)) <= 3000, stalled
        ok(ctx, "browser_navigate", url=f"{site}/spin.html")
        time.sleep(1)  # the page's script loop has started
        ctx.limits = SampleLimits(PromptLimits(seconds=2))
        start = time.monotonic()
        hung = call(ctx, "browser_snapshot")
        assert time.monotonic() - start < 2 + browser_session.DEADLINE_GRACE + 5
        assert "did not respond" in hung["error"]
    finally:
        ctx.close()


def test_a_crashed_browser_is_relaunched(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/page2.html")
    session = ctx.resources[tools_browser.RESOURCE_KEY]
    flag = browser_session.MARKER_FLAG + session._dirs[-1]
    mains = [pid for pid in live_chromium_pids() if flag in Path(f"/proc/{pid}/cmdline").read_bytes().decode()]
    assert len(mains) == 1
    os.killpg(mains[0], signal.SIGKILL)
    time.sleep(0.5)
    # The call that meets the dead browser may fail; the one after must work on a new browser.
    first = call(ctx, "browser_navigate", url=f"{site}/form.html")
    if first["error"]:
        first = ok(ctx, "browser_navigate", url=f"{site}/form.html")
    assert first["title"] == "Sign-up form"
    assert "# Join the newsletter" in ok(ctx, "browser_snapshot")["snapshot"]


def test_get_images(ctx, site):
    ok(ctx, "browser_navigate", url=f"{site}/images.html")
    out = ok(ctx, "browser_get_images")
    assert out["count"] == 2
    assert out["images"][0] == {"url": f"{site}/pixel.png", "alt": "A red pixel", "width": 1, "height": 1}
    assert out["images"][1]["url"] == f"{site}/pixel.png?second=1" and out["images"][1]["alt"] == ""


def test_get_images_waits_a_while_for_images_still_loading(ctx, site):
    # The navigation returns once the document is parsed, before its images came: the one that comes within
    # IMAGES_WAIT has its size, the one that does not is listed without one, and the call does not wait for it.
    ok(ctx, "browser_navigate", url=f"{site}/slow-images")
    start = time.monotonic()
    out = ok(ctx, "browser_get_images")
    took = time.monotonic() - start
    sizes = {i["alt"]: (i["width"], i["height"]) for i in out["images"]}
    assert sizes == {"slow": (1, 1), "too slow": (0, 0)}, out
    assert tools_browser.IMAGES_WAIT - 0.1 <= took < tools_browser.IMAGES_WAIT + 5, took


def test_browser_vision_sends_a_screenshot_to_the_vision_model(site):
    with ScriptedServer(default_script=[{"content": "A page titled Gallery with a red pixel."}]) as server:
        ctx = make_ctx(base_url=server.base_url, api_key="test-key", model="main-model", vision_model="eye-model")
        try:
            ok(ctx, "browser_navigate", url=f"{site}/images.html")
            out = ok(ctx, "browser_vision", question="What is on this page?")
        finally:
            ctx.close()
        requests = server.requests()
    assert out["analysis"] == "A page titled Gallery with a red pixel." and out["url"].endswith("/images.html")
    assert len(requests) == 1 and requests[0]["model"] == "eye-model"
    parts = requests[0]["messages"][0]["content"]
    assert any(p["type"] == "text" and "What is on this page?" in p["text"] for p in parts)
    image = next(p for p in parts if p["type"] == "image_url")["image_url"]["url"]
    assert image.startswith("data:image/png;base64,")
    assert base64.b64decode(image.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert ctx.usage.total_tokens == 15


def test_policy_refuses_loopback_when_private_urls_are_not_allowed(site, monkeypatch):
    monkeypatch.delenv("BATCH_RUNNER_ALLOW_PRIVATE_URLS", raising=False)
    ctx = make_ctx(allow_private_urls=False)
    try:
        out = call(ctx, "browser_navigate", url=f"{site}/form.html")
        assert "loopback" in out["error"]
        assert tools_browser.RESOURCE_KEY not in ctx.resources  # refused before any browser started
    finally:
        ctx.close()


RTC_PAGE = """<!doctype html><html><head><title>rtc</title></head><body><p>rtc</p><script>
// Every way a page can make WebRTC send: a STUN server, TURN over UDP and TCP, a remote peer's candidate.
const pc = new RTCPeerConnection({iceServers: [{urls: "stun:__ADDR__:__UDP__"},
  {urls: "turn:__ADDR__:__UDP__?transport=udp", username: "u", credential: "p"},
  {urls: "turn:__ADDR__:__TCP__?transport=tcp", username: "u", credential: "p"}]});
pc.createDataChannel("x");
pc.onicecandidate = e => { if (!e.candidate) document.title = "gathered"; };
pc.createOffer().then(o => pc.setLocalDescription(o));
(async () => {
  const a = new RTCPeerConnection(), b = new RTCPeerConnection();
  a.createDataChannel("y");
  await a.setLocalDescription(await a.createOffer());
  await b.setRemoteDescription(a.localDescription);
  await b.setLocalDescription(await b.createAnswer());
  await a.setRemoteDescription(b.localDescription);
  await a.addIceCandidate({candidate: "candidate:1 1 udp 2122260223 __ADDR__ __UDP__ typ host", sdpMid: "0"});
  document.body.dataset.peer = "added";
})().catch(e => document.body.dataset.peer = "error " + e);
try { new WebTransport("https://__ADDR__:__UDP__/").ready.catch(() => {}); } catch (e) {}
</script></body></html>"""


def webrtc_reaches(udp: socket.socket, tcp: socket.socket, settle: float) -> dict:
    """Open RTC_PAGE (at 127.0.0.1, the one allowed address) aimed at the listeners on 127.0.0.2; what reached them."""
    addr, udp_port, tcp_port = "127.0.0.2", udp.getsockname()[1], tcp.getsockname()[1]
    page = RTC_PAGE.replace("__ADDR__", addr).replace("__UDP__", str(udp_port)).replace("__TCP__", str(tcp_port))
    fake = FakeSite({"/rtc": lambda seen: html_reply(page.encode())})
    settings = from_environment({}, command_timeout=30)
    ctx = context(replace(settings, private_networks=(ipaddress.ip_network("127.0.0.1/32"),)))
    reached = {"udp": None, "tcp": None}
    with contextlib.suppress(TimeoutError):
        while True:  # what an earlier visit sent before its browser was closed
            udp.recvfrom(2048)
    try:
        opened = ok(ctx, "browser_navigate", url=f"{fake.url}/rtc")
        end = time.monotonic() + settle
        while time.monotonic() < end and not reached["udp"]:
            with contextlib.suppress(TimeoutError):
                reached["udp"] = udp.recvfrom(2048)[1]
            with contextlib.suppress(TimeoutError):
                reached["tcp"] = reached["tcp"] or tcp.accept()[1]
        state = ctx.resources[tools_browser.RESOURCE_KEY].run(
            lambda live: {"title": live.page.title(), "peer": live.page.evaluate("document.body.dataset.peer")}
        )
        blocked = opened.get("blocked_by_url_policy", []) + call(ctx, "browser_snapshot").get(
            "blocked_by_url_policy", []
        )
    finally:
        ctx.close()
        fake.close()
    return {**reached, **state, "refused": [b for b in blocked if addr in b]}


@pytest.fixture
def listeners():
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket()
    for sock in (udp, tcp):
        sock.bind(("127.0.0.2", 0))
        sock.settimeout(0.2)
    tcp.listen()
    yield udp, tcp
    udp.close()
    tcp.close()


def test_webrtc_sends_nothing_the_url_policy_did_not_see(listeners, monkeypatch):
    # Left alone, Chromium's WebRTC sends UDP straight to a refused address: the page reaches the listener.
    bare = tuple(a for a in browser_session.CHROMIUM_ARGS if not a.startswith("--webrtc-ip-handling-policy"))
    with monkeypatch.context() as m:
        m.setattr(browser_session, "CHROMIUM_ARGS", bare)
        assert webrtc_reaches(*listeners, settle=15)["udp"] is not None, "the page no longer exercises WebRTC"
    # As the tools launch it: WebRTC sends UDP nowhere, and its TCP goes through the policy's proxy, refused there.
    got = webrtc_reaches(*listeners, settle=6)
    assert got["udp"] is None and got["tcp"] is None, got
    assert got["peer"] == "added" and got["title"] == "gathered", got  # the page did all it could
    assert got["refused"], got


def test_a_redirect_to_a_refused_address_is_blocked_in_the_browser(site, monkeypatch):
    # 127.0.0.1 is allowed, 127.0.0.2 is not: the redirect target is refused by our route, not by a failed connect.
    monkeypatch.setenv("BATCH_RUNNER_ALLOW_PRIVATE_URLS", "127.0.0.1/32")
    ctx = make_ctx(allow_private_urls=False)
    try:
        port = urlsplit(site).port
        out = call(ctx, "browser_navigate", url=f"{site}/redirect?to=http://127.0.0.2:{port}/form.html")
        assert "refused by the URL policy" in out["error"] and "127.0.0.2" in out["error"]
        assert ok(ctx, "browser_navigate", url=f"{site}/page2.html")["title"] == "Page two"
    finally:
        ctx.close()


def own_chromium(dirs: list[str]) -> set[int]:
    """Running Chromium processes launched with one of these profile directories (no other test's)."""
    marks = [d.encode() for d in dirs]
    own = set()
    for pid in live_chromium_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if any(m in cmdline for m in marks):
            own.add(pid)
    return own


def leftover_own_chromium(dirs: list[str]) -> set[int]:
    deadline = time.monotonic() + 5
    while (left := own_chromium(dirs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_no_chromium_process_outlives_its_prompt(site):
    # Scoped to this prompt's own launches: under a loaded full suite another test's browser may still be
    # starting or stopping, and a machine-wide count would blame this one for it.
    ctx = make_ctx()
    ok(ctx, "browser_navigate", url=f"{site}/form.html")
    session = ctx.resources["browser_session"]
    assert own_chromium(session._dirs), "the browser should be running"
    closed = ok(ctx, "browser_close")
    assert closed["closed"] is True
    assert not leftover_own_chromium(session._dirs)
    ok(ctx, "browser_navigate", url=f"{site}/page2.html")  # a new browser after browser_close
    session = ctx.resources["browser_session"]
    dirs = list(session._dirs)
    assert own_chromium(dirs)
    ctx.close()
    assert not leftover_own_chromium(dirs)


def test_prompts_on_different_threads_each_get_their_own_browser(site):
    results: dict[int, str] = {}

    def prompt(i: int) -> None:
        ctx = make_ctx()
        try:
            ok(ctx, "browser_navigate", url=f"{site}/{'form' if i % 2 else 'page2'}.html")
            results[i] = ok(ctx, "browser_snapshot")["snapshot"].splitlines()[0]
        finally:
            ctx.close()

    threads = [threading.Thread(target=prompt, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {0: "Title: Page two", 1: "Title: Sign-up form", 2: "Title: Page two"}

    ctx = make_ctx()  # one prompt whose tool calls arrive from different threads
    try:
        t = threading.Thread(target=ok, args=(ctx, "browser_navigate"), kwargs={"url": f"{site}/page2.html"})
        t.start()
        t.join(60)
        assert ok(ctx, "browser_snapshot")["snapshot"].startswith("Title: Page two")
    finally:
        ctx.close()


def test_unavailable_without_chromium():
    tools = load_tools()
    assert all(tools[name].unavailable(ToolSettings()) is None for name in tools if name.startswith("browser_"))
    settings = from_environment({"BROWSER_EXECUTABLE": "/nonexistent/chromium"})
    for name in ("browser_navigate", "browser_vision"):
        assert "/nonexistent/chromium" in tools[name].unavailable(settings)
