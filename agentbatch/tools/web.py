"""The web toolset: web_search through a configured search service, web_extract of public pages as text.

web_search is left out of the offered tools when no backend is configured (docs/toolsets.md lists the variables
that configure one); web_extract is always offered and checks every
redirect hop against the private-address policy (url_policy.py). Search service URLs are the operator's own
configuration and are not subject to that policy.
"""

from __future__ import annotations

import contextlib
import html
import math
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urljoin

from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import cap_output, tool
from agentbatch.tools.settings import ToolSettings
from agentbatch.tools.url_policy import Networks, resolve_url

if TYPE_CHECKING:
    import httpx

# httpx and lxml are imported by the functions that use them: every run imports this module at start (to
# know which tools can be offered), and the two took ~0.3 s of it.

MAX_RESULTS = 20  # both Tavily and Brave refuse more per request
MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; batch-runner web_extract)"
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-ndjson")
_HTML_TYPES = ("text/html", "application/xhtml+xml")


class WebError(Exception):
    """A fetch or search failed for a reason worth showing the model."""


# ---------------------------------------------------------------- web_search


def _tavily(s: ToolSettings, query: str, n: int, timeout: float) -> list[dict]:
    base, key = s.tavily_base_url, s.search_credential
    body = {
        "query": query,
        "max_results": n,
        "search_depth": "basic",
        "include_answer": False,
        "include_raw_content": False,
        "include_images": False,
    }
    data = _send("POST", f"{base.rstrip('/')}/search", timeout, json=body, headers={"Authorization": f"Bearer {key}"})
    return [_result(r.get("title"), r.get("url"), r.get("content")) for r in data.get("results") or []]


def _brave(s: ToolSettings, query: str, n: int, timeout: float) -> list[dict]:
    base, key = s.brave_base_url, s.search_credential
    headers = {"Accept": "application/json", "X-Subscription-Token": key}
    data = _send(
        "GET", f"{base.rstrip('/')}/res/v1/web/search", timeout, params={"q": query, "count": n}, headers=headers
    )
    # Brave marks query terms in snippets with <strong>; the model wants plain text.
    return [
        _result(r.get("title"), r.get("url"), _strip_tags(r.get("description")))
        for r in (data.get("web") or {}).get("results") or []
    ]


def _searxng(s: ToolSettings, query: str, n: int, timeout: float) -> list[dict]:
    base = s.search_credential  # SEARXNG_URL enables it
    data = _send("GET", f"{base.rstrip('/')}/search", timeout, params={"q": query, "format": "json"})
    return [_result(r.get("title"), r.get("url"), r.get("content")) for r in data.get("results") or []][:n]


# (settings, query, max_results, timeout) -> results; which one is used is settled at start (tools/settings.py).
BACKENDS: dict[str, Callable[[ToolSettings, str, int, float], list[dict]]] = {
    "tavily": _tavily,
    "brave": _brave,
    "searxng": _searxng,
}


@tool(unavailable=lambda settings: settings.search_unavailable)
def web_search(
    ctx: ToolContext,
    query: Annotated[str, "The search query."],
    max_results: Annotated[int | None, f"How many results (1-{MAX_RESULTS}, default 5)."] = None,
) -> dict:
    """Search the web. Returns the top results, each with title, url and a short description."""
    if not query.strip():
        return {"results": [], "error": "query must be a non-empty string"}
    n = min(max(max_results or 5, 1), MAX_RESULTS)
    s = ctx.settings
    if s.search_backend is None:
        return {"results": [], "error": s.search_unavailable}
    import agentbatch.http_deadline as http_deadline

    left = ctx.limits.time_left()  # every attempt and pause of the search ends by the sample's deadline
    try:
        with http_deadline.deadline(left) if left is not None else contextlib.nullcontext():
            results = BACKENDS[s.search_backend](s, query.strip(), n, _timeout(ctx))
    except WebError as e:
        return {"results": [], "error": f"{s.search_backend} search failed: {e}"}
    return {"results": results, "error": None}


def _send(method: str, url: str, timeout: float, **kwargs) -> dict:
    """One JSON API call, retrying rate limits, server errors and dropped connections a couple of times.

    Each attempt ends within `timeout` however slowly the service answers, and all of them by the deadline
    the caller set, if any (http_deadline): no retry starts that could not finish before it.
    """
    import httpx

    import agentbatch.http_deadline as http_deadline

    attempts = 3
    for attempt in range(attempts):
        last = attempt == attempts - 1
        try:
            with http_deadline.client(timeout=timeout) as client, http_deadline.deadline(timeout):
                resp = client.request(method, url, **kwargs)
        except httpx.HTTPError as e:
            if last or not _pause(2**attempt):
                raise WebError(f"{type(e).__name__}: {e}") from None
            continue
        if (resp.status_code == 429 or resp.status_code >= 500) and not last and _pause(_retry_after(resp, 2**attempt)):
            continue
        if resp.status_code >= 400:
            raise WebError(f"HTTP {resp.status_code}: {resp.text[:300].strip()}")
        try:
            data = resp.json()
        except ValueError:
            raise WebError(f"the reply is not JSON: {resp.text[:200]!r}") from None
        if not isinstance(data, dict):
            raise WebError("the reply is not a JSON object")
        return data
    raise AssertionError("unreachable")


def _pause(seconds: float) -> bool:
    """Sleep before a retry, unless the caller's deadline comes first (then False: no retry)."""
    import agentbatch.http_deadline as http_deadline

    left = http_deadline.remaining()
    if left is not None and left <= seconds:
        return False
    time.sleep(seconds)
    return True


def _retry_after(resp: httpx.Response, default: float) -> float:
    try:
        seconds = float(resp.headers.get("retry-after", default))
    except ValueError:
        return default
    return min(max(seconds, 0.0), 10.0) if math.isfinite(seconds) else default  # "nan" is no number of seconds


def _result(title, url, description) -> dict:
    return {"title": str(title or "").strip(), "url": str(url or ""), "description": str(description or "").strip()}


def _strip_tags(text) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", str(text or "")))


# ---------------------------------------------------------------- web_extract


@tool(aliases={"url": "urls"})
def web_extract(ctx: ToolContext, urls: Annotated[list[str], "http(s) URLs of the pages to read."]) -> dict:
    """Fetch web pages and return their main content as markdown text, with the page title.
    Each URL gets its own result or error."""
    if not urls or not all(u.strip() for u in urls):
        return {"results": [], "error": "urls must be a non-empty list of URL strings"}
    s = ctx.settings
    if len(urls) > s.web_extract_max_urls:
        return {"results": [], "error": f"at most {s.web_extract_max_urls} URLs per call (got {len(urls)})"}
    limit = max(s.max_output_chars // len(urls), 1000)

    def one(url: str) -> dict:
        return extract_url(url.strip(), s.private_networks, _timeout(ctx), limit, s.web_extract_max_bytes)

    with ThreadPoolExecutor(max_workers=min(len(urls), 5)) as pool:
        results = list(pool.map(one, urls))
    failed = [r for r in results if r["error"]]
    error = None
    if len(failed) == len(results):
        error = failed[0]["error"] if len(failed) == 1 else f"all {len(failed)} URLs failed"
    return {"results": results, "error": error}


def extract_url(url: str, allowed: Networks, timeout: float, limit: int, max_bytes: int) -> dict:
    """Fetch one page and turn it into readable text; failures are reported in the entry, never raised."""
    import httpx

    entry = {"url": url, "final_url": url, "title": "", "content": "", "error": None}
    try:
        final_url, content_type, body = fetch(url, allowed, timeout, max_bytes)
        entry["final_url"] = final_url
        title, text = page_text(body, content_type, final_url)
        if not text.strip():
            raise WebError("the page has no readable text")
        entry.update(title=title, content=cap_output(text.strip(), limit))
    except (WebError, ValueError) as e:
        entry["error"] = str(e)
    except httpx.HTTPError as e:
        entry["error"] = f"{type(e).__name__}: {e}"
    return entry


def fetch(url: str, allowed: Networks, timeout: float, max_bytes: int) -> tuple[str, str, bytes]:
    """GET url following redirects by hand, so each hop is checked by url_policy before any connection to it.

    Returns (final URL, content type, body). The whole fetch, every hop and the last byte included, ends
    within `timeout` (http_deadline): a page trickling a byte a second cannot hold the tool.
    """

    import agentbatch.http_deadline as http_deadline

    with (
        http_deadline.client(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT}) as client,
        http_deadline.deadline(timeout),
    ):
        for _ in range(MAX_REDIRECTS + 1):
            resp = _connect(client, url, resolve_url(url, allowed))
            with contextlib.closing(resp):
                location = resp.headers.get("location")
                if resp.is_redirect and location:
                    url = urljoin(url, location)
                    continue
                if resp.status_code >= 400:
                    raise WebError(f"HTTP {resp.status_code} {resp.reason_phrase}".strip())
                declared = resp.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > max_bytes:
                    raise WebError(f"the page is {int(declared)} bytes, over the {max_bytes}-byte limit")
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > max_bytes:
                        raise WebError(f"the page is over the {max_bytes}-byte limit")
                return url, resp.headers.get("content-type", ""), bytes(body)
    raise WebError(f"more than {MAX_REDIRECTS} redirects")


def _connect(client: httpx.Client, url: str, addresses: list[str]) -> httpx.Response:
    """Send the GET to the first checked address that accepts a connection (a name may resolve to ::1 and 127.0.0.1)."""
    import httpx

    for i, address in enumerate(addresses):
        try:
            return client.send(client.build_request("GET", **_pinned(url, address)), stream=True)
        except httpx.ConnectError:
            if i == len(addresses) - 1:
                raise
    raise AssertionError("resolve_url returns at least one address")


def _pinned(url: str, address: str) -> dict:
    """Request arguments that connect to the checked address, so a second DNS answer cannot differ."""
    import httpx

    parsed = httpx.URL(url)
    extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
    return {
        "url": parsed.copy_with(host=address),
        "headers": {"Host": parsed.netloc.decode("ascii")},
        "extensions": extensions,
    }


def page_text(body: bytes, content_type: str, url: str) -> tuple[str, str]:
    """(title, text) of a downloaded page: HTML as markdown via trafilatura, text types as they are."""
    mime, _, params = content_type.partition(";")
    mime = mime.strip().lower()
    charset = _charset(params)
    looks_html = body.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html"))
    if mime in _HTML_TYPES or (mime in ("", "application/octet-stream", "text/plain") and looks_html):
        import trafilatura  # imported here: ~70 ms (it and its URL and date helpers) at every worker start

        # Without a declared charset trafilatura sniffs the <meta> one from the bytes.
        doc = body.decode(charset, "replace") if charset else body
        text = trafilatura.extract(
            doc, url=url, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
        )
        metadata = trafilatura.extract_metadata(doc, default_url=url)
        title = metadata.title if metadata and metadata.title else ""
        if not text:
            fallback_title, text = _plain_text(body.decode(charset or "utf-8", "replace"))
            title = title or fallback_title
        return title, text or ""
    if mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml")):
        return "", body.decode(charset or "utf-8", "replace")
    raise WebError(f"unsupported content type {mime or 'unknown'!r}: web_extract reads HTML and text pages")


def _plain_text(document: str) -> tuple[str, str]:
    """Every visible text node, for pages trafilatura finds no main content in."""
    import lxml.html
    from lxml import etree

    try:
        tree = lxml.html.fromstring(document)
    except (ValueError, etree.ParserError):
        return "", ""
    for bad in tree.xpath("//script|//style|//noscript|//template"):
        bad.drop_tree()
    title = " ".join((tree.findtext(".//title") or "").split())
    lines = (" ".join(line.split()) for line in tree.text_content().splitlines())
    return title, "\n".join(line for line in lines if line)


def _charset(params: str) -> str | None:
    match = re.search(r"charset\s*=\s*\"?([\w.:-]+)", params, re.I)
    if not match:
        return None
    try:
        "".encode(match.group(1))
    except LookupError:
        return None
    return match.group(1)


def _timeout(ctx: ToolContext) -> float:
    return min(ctx.settings.web_timeout, ctx.settings.request_timeout)
