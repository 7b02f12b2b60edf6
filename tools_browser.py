"""The browser toolset (SPEC §3): a real headless Chromium per prompt, driven through browser_session.

The prompt's `BrowserSession` is made on its first browser call, kept in `ctx.resources` and closed by
`ctx.on_cleanup`, so no Chromium outlives its prompt. browser_snapshot stamps a `data-br-ref` attribute on
every interactive element it lists; the refs (`e12`) stay in the DOM, so they survive scrolling and later
snapshots, and browser_click / browser_type find elements by them. Refs are numbered over the whole
session, so a ref from a page the browser has left is reported as stale rather than hitting another element.
Frames are not descended into: their elements get no refs.
"""

from __future__ import annotations

import base64
import re
import time
from typing import Any

from browser_session import (
    REFUSED_HEADER,
    BrowserError,
    BrowserSession,
    Live,
    short_error,
    unavailable_reason,
)
from tool_registry import Tool, ToolContext, ToolSettings, register

RESOURCE_KEY = "browser_session"
NAVIGATION_TIMEOUT = 30.0  # capped by settings.command_timeout
ACTION_TIMEOUT = 10.0
NAVIGATION_GRACE = 0.5  # how long after a click or key press a navigation it triggers may take to start
SNAPSHOT_MAX_CHARS = 60_000
MAX_IMAGES = 200
REF_ATTR = "data-br-ref"
_REF = re.compile(r"^\[?(e\d+)\]?$")

SNAPSHOT_JS = r"""
([start, maxChars]) => {
  const ATTR = "data-br-ref";
  const SKIP = new Set(["SCRIPT", "STYLE", "NOSCRIPT", "TEMPLATE", "HEAD", "META", "LINK"]);
  const ROLES = new Set(["button", "link", "checkbox", "radio", "switch", "tab", "menuitem", "menuitemcheckbox",
    "menuitemradio", "option", "textbox", "searchbox", "combobox", "slider", "spinbutton", "treeitem"]);
  const NATIVE = new Set(["A", "BUTTON", "INPUT", "SELECT", "TEXTAREA", "SUMMARY"]);
  let next = start, count = 0, size = 0, truncated = false;
  const seen = new Set(), lines = [];
  let line = [];
  const clip = (s, n) => { s = (s || "").replace(/\s+/g, " ").trim(); return s.length > n ? s.slice(0, n) + "…" : s; };
  const flush = () => {
    const t = line.join(" ").replace(/\s+/g, " ").trim();
    line = [];
    if (!t || truncated) return;
    if (size + t.length > maxChars) { truncated = true; return; }
    lines.push(t); size += t.length + 1;
  };
  const interactive = (el) => {
    const tag = el.tagName;
    if (tag === "A") return el.hasAttribute("href") || el.hasAttribute("onclick");
    if (tag === "INPUT") return el.type !== "hidden";
    if (NATIVE.has(tag)) return true;
    if (ROLES.has((el.getAttribute("role") || "").toLowerCase())) return true;
    if (el.hasAttribute("onclick") || el.onclick) return true;
    if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) return true;
    const ti = el.getAttribute("tabindex");
    return ti !== null && Number(ti) >= 0 && tag !== "BODY" && tag !== "HTML";
  };
  const stamp = (el) => {
    let ref = el.getAttribute(ATTR);
    if (!ref || seen.has(ref)) { ref = "e" + next++; el.setAttribute(ATTR, ref); }
    seen.add(ref); count++;
    return ref;
  };
  const labelOf = (el) => {
    const aria = el.getAttribute("aria-label");
    if (aria) return aria;
    const by = el.getAttribute("aria-labelledby");
    if (by) {
      const t = by.split(/\s+/).map((id) => document.getElementById(id)).filter(Boolean).map((n) => n.innerText).join(" ");
      if (t.trim()) return t;
    }
    if (el.labels && el.labels.length) return Array.from(el.labels).map((l) => l.innerText).join(" ");
    return "";
  };
  const describe = (el, ref) => {
    const tag = el.tagName;
    const role = (el.getAttribute("role") || "").toLowerCase();
    const parts = [];
    let kind, name = labelOf(el);
    if (tag === "A") {
      kind = role || "link";
      name = name || el.innerText || (el.querySelector("img") || {}).alt || el.title;
    } else if (tag === "INPUT") {
      const type = (el.type || "text").toLowerCase();
      if (["submit", "button", "reset", "image"].includes(type)) { kind = "button"; name = name || el.value || el.alt || type; }
      else if (type === "checkbox" || type === "radio") { kind = type; if (el.checked) parts.push("checked"); }
      else {
        kind = type === "text" ? "textbox" : type + " input";
        name = name || el.placeholder || el.title;
        if (el.value && type !== "password") parts.push(`value="${clip(el.value, 80)}"`);
        if (el.placeholder && name !== el.placeholder) parts.push(`placeholder="${clip(el.placeholder, 40)}"`);
      }
      if (el.name) parts.push(`name=${clip(el.name, 30)}`);
    } else if (tag === "SELECT") {
      kind = "select";
      const opts = Array.from(el.options).slice(0, 25).map((o) => clip(o.text, 30) + (o.selected ? "*" : ""));
      parts.push("options: " + opts.join(" | ") + (el.options.length > 25 ? " | …" : ""));
    } else if (tag === "TEXTAREA") {
      kind = "textarea"; name = name || el.placeholder;
      if (el.value) parts.push(`value="${clip(el.value, 120)}"`);
    } else {
      kind = role || (tag === "BUTTON" ? "button" : tag === "SUMMARY" ? "summary" : el.isContentEditable ? "editable" : "clickable");
      name = name || (NATIVE.has(tag) ? el.innerText : "") || el.title;
    }
    if (el.disabled) parts.push("disabled");
    if (tag === "A" && el.getAttribute("href")) parts.push("-> " + clip(el.getAttribute("href"), 100));
    return `[${ref}] ${kind}${name ? ` "${clip(name, 80)}"` : ""}${parts.length ? " " + parts.join(" ") : ""}`;
  };
  const walk = (node) => {
    if (truncated) return;
    if (node.nodeType === Node.TEXT_NODE) {
      const p = node.parentElement;
      if (p && getComputedStyle(p).visibility !== "hidden") line.push(node.textContent);
      return;
    }
    if (node.nodeType !== Node.ELEMENT_NODE) {
      if (node.nodeType === Node.DOCUMENT_FRAGMENT_NODE) node.childNodes.forEach(walk);
      return;
    }
    const el = node;
    if (SKIP.has(el.tagName) || el.hidden || el.getAttribute("aria-hidden") === "true") return;
    const style = getComputedStyle(el);
    if (style.display === "none") return;
    const block = !style.display.startsWith("inline") || el.tagName === "BR";
    if (block) flush();
    const heading = /^H([1-6])$/.exec(el.tagName);
    if (heading) line.push("#".repeat(Number(heading[1])));
    else if (el.tagName === "LI") line.push("-");
    if (el.tagName === "IFRAME") { line.push(`[frame ${clip(el.src, 100)}]`); flush(); return; }
    if (el.tagName === "IMG" && el.alt && !el.closest("a,button")) line.push(`image "${clip(el.alt, 80)}"`);
    if (style.visibility !== "hidden" && interactive(el)) {
      line.push(describe(el, stamp(el)));
      if (NATIVE.has(el.tagName)) { if (block) flush(); return; }
    }
    if (el.shadowRoot) walk(el.shadowRoot);
    el.childNodes.forEach(walk);
    if (block) flush();
  };
  if (document.body) walk(document.body);
  flush();
  return { text: lines.join("\n"), next, count, truncated };
}
"""

IMAGES_JS = """
(limit) => Array.from(document.images).slice(0, limit).map((img) => ({
  url: (img.currentSrc || img.src || "").slice(0, 500),
  alt: img.alt || "",
  width: img.naturalWidth,
  height: img.naturalHeight,
})).filter((i) => i.url)
"""

# Scroll events fire on the next frame: wait two frames (and a beat for timers) so that content a page adds
# on scroll (infinite lists, "load more") is there for the next snapshot.
SCROLL_JS = """
async (dy) => { window.scrollBy(0, dy * window.innerHeight * 0.8);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(r, 50))));
  const el = document.scrollingElement || document.documentElement;
  return { scroll_y: Math.round(window.scrollY), page_height: el.scrollHeight, viewport_height: window.innerHeight }; }
"""


def _timeout(settings: ToolSettings) -> float:
    return max(1.0, min(NAVIGATION_TIMEOUT, settings.command_timeout))


def _session(ctx: ToolContext) -> BrowserSession:
    session = ctx.resources.get(RESOURCE_KEY)
    if session is None or session.broken:
        if session is not None:
            session.close()
        session = BrowserSession(ctx.settings.allow_private_urls, timeout=_timeout(ctx.settings))
        ctx.resources[RESOURCE_KEY] = session
        ctx.on_cleanup(session.close)
    return session


def _run(ctx: ToolContext, fn: Any, **extra: Any) -> dict:
    """Run fn(live) in the prompt's browser; Playwright and policy failures become error results."""
    session = _session(ctx)
    try:
        result = session.run(fn)
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
        deadline = time.monotonic() + live.session.timeout
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


def browser_navigate(args: dict, ctx: ToolContext) -> dict:
    url = args.get("url")
    if not isinstance(url, str) or not url.strip():
        return {"error": "url must be a non-empty string"}
    url = url.strip()
    if "://" not in url:
        url = "https://" + url
    import url_policy

    try:
        url_policy.check_url(url, ctx.settings.allow_private_urls)
    except ValueError as e:
        return {"error": str(e)}

    def go(live: Live) -> dict:
        response = live.page.goto(url, wait_until="domcontentloaded")
        if response is not None and response.headers.get(REFUSED_HEADER.lower()):
            return _page_info(live, status=response.status, error="refused by the URL policy")
        return _page_info(live, status=response.status if response else None)

    return _run(ctx, go)


def browser_snapshot(args: dict, ctx: ToolContext) -> dict:
    def snap(live: Live) -> dict:
        page = live.page
        out = page.evaluate(SNAPSHOT_JS, [live.ref_counter, SNAPSHOT_MAX_CHARS])
        live.ref_counter = out["next"]
        head = f"Title: {page.title()}\nURL: {page.url}\n\n"
        tail = "\n[snapshot truncated]" if out["truncated"] else ""
        return {"snapshot": head + out["text"] + tail, "element_count": out["count"]}

    return _run(ctx, snap)


def browser_click(args: dict, ctx: ToolContext) -> dict:
    def click(live: Live) -> dict:
        element = _element(live, args.get("ref"))
        _act(live, lambda: element.click(timeout=ACTION_TIMEOUT * 1000))
        return _page_info(live, clicked=args.get("ref"))

    return _run(ctx, click)


def browser_type(args: dict, ctx: ToolContext) -> dict:
    text = args.get("text")
    if not isinstance(text, str):
        return {"error": "text must be a string"}

    def type_(live: Live) -> dict:
        element = _element(live, args.get("ref"))
        if element.evaluate("el => el.tagName") == "SELECT":
            element.select_option(label=text, timeout=ACTION_TIMEOUT * 1000)
        else:
            element.fill(text, timeout=ACTION_TIMEOUT * 1000)
        if args.get("submit"):
            _act(live, lambda: element.press("Enter", timeout=ACTION_TIMEOUT * 1000))
        return _page_info(live, typed=args.get("ref"))

    return _run(ctx, type_)


def browser_scroll(args: dict, ctx: ToolContext) -> dict:
    direction = str(args.get("direction") or "down").lower()
    if direction not in ("up", "down"):
        return {"error": "direction must be 'up' or 'down'"}
    return _run(
        ctx,
        lambda live: live.page.evaluate(SCROLL_JS, 1 if direction == "down" else -1),
    )


def browser_back(args: dict, ctx: ToolContext) -> dict:
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


def browser_press(args: dict, ctx: ToolContext) -> dict:
    key = args.get("key")
    if not isinstance(key, str) or not key:
        return {"error": "key must be a key name such as Enter, Tab, Escape, ArrowDown or Control+a"}

    def press(live: Live) -> dict:
        _act(live, lambda: live.page.keyboard.press(key))
        return _page_info(live, pressed=key)

    return _run(ctx, press)


def browser_close(args: dict, ctx: ToolContext) -> dict:
    session = ctx.resources.pop(RESOURCE_KEY, None)
    if session is None:
        return {"closed": False, "error": None}
    session.close()
    return {"closed": True, "error": None}


def browser_get_images(args: dict, ctx: ToolContext) -> dict:
    def images(live: Live) -> dict:
        found = live.page.evaluate(IMAGES_JS, MAX_IMAGES)
        return {"url": live.page.url, "images": found, "count": len(found)}

    return _run(ctx, images)


def browser_vision(args: dict, ctx: ToolContext) -> dict:
    question = args.get("question")
    if not isinstance(question, str) or not question.strip():
        return {"error": "question must be a non-empty string"}
    shot = _run(
        ctx,
        lambda live: _page_info(live, png=live.page.screenshot(type="png", timeout=live.timeout_ms)),
    )
    if shot.get("error"):
        return shot
    # The model call runs outside the browser thread: a slow model must not hold up the browser.
    from openai import OpenAI

    settings = ctx.settings
    client = OpenAI(
        base_url=settings.base_url,
        api_key=settings.api_key,
        timeout=settings.request_timeout,
    )
    data_url = "data:image/png;base64," + base64.b64encode(shot.pop("png")).decode("ascii")
    response = client.chat.completions.create(
        model=settings.vision_model or settings.model,
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": f"This is a screenshot of the web page {shot['url']}.\n{question}",
                    },
                    {"type": "image_url", "image_url": {"url": data_url}},
                ],
            }
        ],
    )
    ctx.usage.add(response.usage)
    answer = response.choices[0].message.content if response.choices else None
    if not answer:
        return {**shot, "error": "the vision model returned no answer"}
    return {**shot, "analysis": answer}


def _unavailable(settings: ToolSettings) -> str | None:
    return unavailable_reason()


def _vision_unavailable(settings: ToolSettings) -> str | None:
    if not (settings.vision_model or settings.model):
        return "no vision model configured"
    if not settings.api_key:
        return "no API key configured for the vision model"
    return unavailable_reason()


_OBJ = {"type": "object", "properties": {}}
_REF_PARAM = {
    "type": "string",
    "description": "Element reference from browser_snapshot, e.g. e12.",
}

_TOOLS = [
    (
        "browser_navigate",
        "Open a URL in the browser. Then call browser_snapshot to read the page.",
        {
            "type": "object",
            "properties": {"url": {"type": "string"}},
            "required": ["url"],
        },
        browser_navigate,
    ),
    (
        "browser_snapshot",
        "Text view of the current page: title, URL, text, and every interactive element with a ref like [e12].",
        _OBJ,
        browser_snapshot,
    ),
    (
        "browser_click",
        "Click the element with the given ref (from browser_snapshot).",
        {"type": "object", "properties": {"ref": _REF_PARAM}, "required": ["ref"]},
        browser_click,
    ),
    (
        "browser_type",
        "Type text into an input or textarea by ref (replacing its content; for a select, choose the option with "
        "this label); submit=true presses Enter afterwards.",
        {
            "type": "object",
            "properties": {
                "ref": _REF_PARAM,
                "text": {"type": "string"},
                "submit": {"type": "boolean"},
            },
            "required": ["ref", "text"],
        },
        browser_type,
    ),
    (
        "browser_scroll",
        "Scroll the page up or down by most of a screen.",
        {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["up", "down"]}},
            "required": ["direction"],
        },
        browser_scroll,
    ),
    (
        "browser_back",
        "Go back to the previous page in the browser history.",
        _OBJ,
        browser_back,
    ),
    (
        "browser_press",
        "Press a key in the page, e.g. Enter, Tab, Escape, ArrowDown, PageDown or Control+a.",
        {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        },
        browser_press,
    ),
    (
        "browser_close",
        "Close the browser (the next browser call opens a fresh one).",
        _OBJ,
        browser_close,
    ),
    (
        "browser_get_images",
        "List the images on the current page: URL, alt text and size.",
        _OBJ,
        browser_get_images,
    ),
    (
        "browser_vision",
        "Ask a vision model a question about a screenshot of the current page.",
        {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        },
        browser_vision,
    ),
]

for _name, _description, _parameters, _handler in _TOOLS:
    register(
        Tool(
            _name,
            _description,
            _parameters,
            _handler,
            _vision_unavailable if _name == "browser_vision" else _unavailable,
        )
    )
