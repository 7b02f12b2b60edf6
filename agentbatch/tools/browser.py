"""The browser toolset: a real headless Chromium per sample, driven through browser_session.

The prompt's `BrowserSession` is made on its first browser call, kept in `ctx.resources` and closed by
`ctx.on_cleanup`, so no Chromium outlives its sample. browser_snapshot stamps a `data-br-ref` attribute on
every interactive element it lists; the refs (`e12`) stay in the DOM, so they survive scrolling and later
snapshots, and browser_click / browser_type find elements by them. Refs are numbered over the whole
session, so a ref from a page the browser has left is reported as stale rather than hitting another element.
Frames are not descended into: their elements get no refs.
"""

from __future__ import annotations

import base64
import re
import time
from typing import Annotated, Any, Literal

from agentbatch.model.base import ModelCallError
from agentbatch.tools import url_policy
from agentbatch.tools.browser_proxy import REFUSED_HEADER
from agentbatch.tools.browser_scripts import IMAGES_JS, SCROLL_JS, SNAPSHOT_JS
from agentbatch.tools.browser_session import (
    BrowserError,
    BrowserSession,
    Live,
    short_error,
    unavailable_reason,
)
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool
from agentbatch.tools.settings import ToolSettings
from agentbatch.tools.vision import vision_model

RESOURCE_KEY = "browser_session"
NAVIGATION_TIMEOUT = 30.0  # capped by settings.command_timeout (itself cut to the time the sample has left)
ACTION_TIMEOUT = 10.0
NAVIGATION_GRACE = 0.5  # how long after a click or key press a navigation it triggers may take to start
SNAPSHOT_MAX_CHARS = 60_000
MAX_IMAGES = 200
IMAGES_WAIT = 2.0  # seconds browser_get_images waits for images still loading (a size is 0 until one has)
REF_ATTR = "data-br-ref"
_REF = re.compile(r"^\[?(e\d+)\]?$")


def _timeout(settings: ToolSettings) -> float:
    return max(1.0, min(NAVIGATION_TIMEOUT, settings.command_timeout))


def _session(ctx: ToolContext) -> BrowserSession:
    session = ctx.resources.get(RESOURCE_KEY)
    if session is None or session.broken:
        if session is not None:
            session.close()
        s = ctx.settings
        session = BrowserSession(s.private_networks, s.browser_executable, timeout=_timeout(s))
        ctx.resources[RESOURCE_KEY] = session
        ctx.on_cleanup(session.close)
    return session


def _run(ctx: ToolContext, fn: Any, **extra: Any) -> dict:
    """Run fn(live) in the sample's browser; Playwright and policy failures become error results."""
    session = _session(ctx)
    try:
        result = session.run(fn, _timeout(ctx.settings), ctx.limits.deadline)
    except BrowserError as e:
        result = {"error": str(e)}
    except Exception as e:  # Playwright's errors: timeouts, closed targets, bad selectors or keys
        result = {"error": short_error(e)}
    blocked = session.take_blocked()
    if blocked:
        result["blocked_by_url_policy"] = blocked[:5]
        if result.get("error") and re.search("refused by the URL policy|ERR_TUNNEL_CONNECTION_FAILED", result["error"]):
            result["error"] = f"refused by the URL policy: {blocked[0]}"
    result.setdefault("error", None)
    return {**extra, **result}


def _page_info(live: Live, **extra: Any) -> dict:
    page = live.page
    return {"url": page.url, "title": page.title(), **extra}


def _act(live: Live, action: Any) -> None:
    """Run an action that may start a navigation (a click, a key) and wait for the new page to be usable."""
    page = live.page
    seen = {"request": False, "done": False}

    def on_request(request: Any) -> None:
        if request.is_navigation_request() and request.frame == page.main_frame:
            seen["request"] = True

    def on_done(target: Any) -> None:
        frame = getattr(target, "frame", target)
        if frame == page.main_frame and (frame is target or target.is_navigation_request()):
            seen["done"] = True

    listeners = (("request", on_request), ("framenavigated", on_done), ("requestfailed", on_done))
    for event, fn in listeners:
        page.on(event, fn)
    try:
        action()
        # Script handlers start their navigation a moment after the event that triggered them.
        deadline = time.monotonic() + NAVIGATION_GRACE
        while not (seen["request"] or seen["done"]) and time.monotonic() < deadline:
            page.wait_for_timeout(50)
        deadline = time.monotonic() + live.timeout_ms / 1000
        while seen["request"] and not seen["done"] and time.monotonic() < deadline:
            page.wait_for_timeout(50)
    finally:
        for event, fn in listeners:
            page.remove_listener(event, fn)
    try:
        live.page.wait_for_load_state("domcontentloaded", timeout=live.timeout_ms)
    except Exception:  # noqa: BLE001 - a slow page is still usable; the model can snapshot what is there
        pass


def _element(live: Live, ref: Any) -> Any:
    match = _REF.match(str(ref or "").strip())
    if not match:
        raise ValueError(f"ref must look like e12 (from browser_snapshot), got {ref!r}")
    ref = match.group(1)
    locator = live.page.locator(f'[{REF_ATTR}="{ref}"]')
    if locator.count() == 0:
        raise ValueError(f"ref {ref} is unknown or stale (the page changed); take a new browser_snapshot")
    return locator.first


def _available(settings: ToolSettings) -> str | None:
    return unavailable_reason(settings.browser_executable)


browser_tool = tool(unavailable=_available)
Ref = Annotated[str, "Element reference from browser_snapshot, e.g. e12."]


@browser_tool
def browser_navigate(ctx: ToolContext, url: str) -> dict:
    """Open a URL in the browser. Then call browser_snapshot to read the page."""
    url = url.strip()
    if not url:
        return {"error": "url must be a non-empty string"}
    if "://" not in url:
        url = "https://" + url
    try:
        url_policy.check_url(url, ctx.settings.private_networks)
    except ValueError as e:
        return {"error": str(e)}

    def go(live: Live) -> dict:
        response = live.page.goto(url, wait_until="domcontentloaded")
        if response is not None and response.headers.get(REFUSED_HEADER.lower()):
            return _page_info(live, status=response.status, error="refused by the URL policy")
        return _page_info(live, status=response.status if response else None)

    return _run(ctx, go)


@browser_tool
def browser_snapshot(ctx: ToolContext) -> dict:
    """Text view of the current page: title, URL, text, and every interactive element with a ref like [e12]."""

    def snap(live: Live) -> dict:
        page = live.page
        out = page.evaluate(SNAPSHOT_JS, [live.ref_counter, SNAPSHOT_MAX_CHARS])
        live.ref_counter = out["next"]
        head = f"Title: {page.title()}\nURL: {page.url}\n\n"
        tail = "\n[snapshot truncated]" if out["truncated"] else ""
        return {"snapshot": head + out["text"] + tail, "element_count": out["count"]}

    return _run(ctx, snap)


@browser_tool
def browser_click(ctx: ToolContext, ref: Ref) -> dict:
    """Click the element with the given ref (from browser_snapshot)."""

    def click(live: Live) -> dict:
        element = _element(live, ref)
        _act(live, lambda: element.click(timeout=ACTION_TIMEOUT * 1000))
        return _page_info(live, clicked=ref)

    return _run(ctx, click)


@browser_tool
def browser_type(ctx: ToolContext, ref: Ref, text: str, submit: bool | None = None) -> dict:
    """Type text into an input or textarea by ref (replacing its content; for a select, choose the option with
    this label); submit=true presses Enter afterwards."""

    def type_(live: Live) -> dict:
        element = _element(live, ref)
        if element.evaluate("el => el.tagName") == "SELECT":
            element.select_option(label=text, timeout=ACTION_TIMEOUT * 1000)
        else:
            element.fill(text, timeout=ACTION_TIMEOUT * 1000)
        if submit:
            _act(live, lambda: element.press("Enter", timeout=ACTION_TIMEOUT * 1000))
        return _page_info(live, typed=ref)

    return _run(ctx, type_)


@browser_tool
def browser_scroll(ctx: ToolContext, direction: Literal["up", "down"]) -> dict:
    """Scroll the page up or down by most of a screen."""
    direction = direction.lower()
    if direction not in ("up", "down"):
        return {"error": "direction must be 'up' or 'down'"}
    return _run(ctx, lambda live: live.page.evaluate(SCROLL_JS, 1 if direction == "down" else -1))


@browser_tool
def browser_back(ctx: ToolContext) -> dict:
    """Go back to the previous page in the browser history."""

    def back(live: Live) -> dict:
        page = live.page
        before = page.url
        page.go_back(wait_until="domcontentloaded")
        if page.url == "about:blank" and before != "about:blank":
            page.go_forward(wait_until="domcontentloaded")  # the tab's blank start page is no page to go back to
        if page.url == before:
            return {"error": "there is no previous page in this tab's history"}
        return _page_info(live)

    return _run(ctx, back)


@browser_tool
def browser_press(ctx: ToolContext, key: str) -> dict:
    """Press a key in the page, e.g. Enter, Tab, Escape, ArrowDown, PageDown or Control+a."""
    if not key:
        return {"error": "key must be a key name such as Enter, Tab, Escape, ArrowDown or Control+a"}

    def press(live: Live) -> dict:
        _act(live, lambda: live.page.keyboard.press(key))
        return _page_info(live, pressed=key)

    return _run(ctx, press)


@browser_tool
def browser_close(ctx: ToolContext) -> dict:
    """Close the browser (the next browser call opens a fresh one)."""
    session = ctx.resources.pop(RESOURCE_KEY, None)
    if session is None:
        return {"closed": False, "error": None}
    session.close()
    return {"closed": True, "error": None}


@browser_tool
def browser_get_images(ctx: ToolContext) -> dict:
    """List the images on the current page: URL, alt text and size."""

    def images(live: Live) -> dict:
        wait_ms = min(IMAGES_WAIT * 1000, live.timeout_ms / 2)
        found = live.page.evaluate(IMAGES_JS, [MAX_IMAGES, wait_ms])
        return {"url": live.page.url, "images": found, "count": len(found)}

    return _run(ctx, images)


@browser_tool
def browser_vision(ctx: ToolContext, question: str) -> dict:
    """Ask a vision model a question about a screenshot of the current page."""
    if not question.strip():
        return {"error": "question must be a non-empty string"}
    shot = _run(
        ctx,
        lambda live: _page_info(live, png=live.page.screenshot(type="png", timeout=live.timeout_ms)),
    )
    if shot.get("error"):
        return shot
    # The model call runs outside the browser thread: a slow model must not hold up the browser.
    data_url = "data:image/png;base64," + base64.b64encode(shot.pop("png")).decode("ascii")
    text = f"This is a screenshot of the web page {shot['url']}.\n{question}"
    content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": data_url}}]
    try:
        answer = ctx.ask([{"role": "user", "content": content}], vision_model(ctx))
    except ModelCallError as e:
        return {**shot, "error": f"vision model {vision_model(ctx)}: {e}"}
    if not answer:
        return {**shot, "error": "the vision model returned no answer"}
    return {**shot, "analysis": answer}
