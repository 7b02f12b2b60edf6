"""The web toolset: web_search through a configured search service, web_extract of public pages as text.

Environment:
    TAVILY_API_KEY         enables the Tavily backend (POST {TAVILY_BASE_URL}/search, Bearer auth)
    TAVILY_BASE_URL        default https://api.tavily.com
    BRAVE_API_KEY          enables the Brave backend (GET {BRAVE_BASE_URL}/res/v1/web/search, X-Subscription-Token)
    BRAVE_BASE_URL         default https://api.search.brave.com
    SEARXNG_URL            enables a SearXNG instance (GET {SEARXNG_URL}/search?format=json); its settings.yml
                           must list json under search.formats
    WEB_SEARCH_BACKEND     tavily, brave or searxng: which one to use when several are configured
                           (default: the first configured in that order)
    WEB_TIMEOUT            seconds per HTTP request (default 30)
    WEB_EXTRACT_MAX_BYTES  largest response web_extract downloads, after decompression (default 5000000)
    WEB_EXTRACT_MAX_URLS   most URLs per web_extract call (default 10)
    BATCH_RUNNER_ALLOW_PRIVATE_URLS  see url_policy.py; web_extract checks every redirect hop against it

web_search is left out of the offered tools when no backend is configured; web_extract is always offered.
Search service URLs are the operator's own configuration and are not subject to the private-address policy.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urljoin

import httpx
import lxml.html
from lxml import etree

from secrets_guard import getenv
from tool_registry import Tool, ToolContext, cap_output, register
from url_policy import resolve_url

TAVILY_URL = "https://api.tavily.com"
BRAVE_URL = "https://api.search.brave.com"
MAX_RESULTS = 20  # both Tavily and Brave refuse more per request
MAX_REDIRECTS = 5
USER_AGENT = "Mozilla/5.0 (compatible; batch-runner web_extract)"
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-ndjson")
_HTML_TYPES = ("text/html", "application/xhtml+xml")


class WebError(Exception):
    """A fetch or search failed for a reason worth showing the model."""


# ---------------------------------------------------------------- web_search


@dataclass(frozen=True)
class SearchBackend:
    """A search service: the variable that enables it and how to query it."""

    name: str
    env: str
    search: Callable[[str, str, int, float], list[dict]]  # (credential, query, max_results, timeout)


def _tavily(key: str, query: str, n: int, timeout: float) -> list[dict]:
    base = os.environ.get("TAVILY_BASE_URL") or TAVILY_URL
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


def _brave(key: str, query: str, n: int, timeout: float) -> list[dict]:
    base = os.environ.get("BRAVE_BASE_URL") or BRAVE_URL
    headers = {"Accept": "application/json", "X-Subscription-Token": key}
    data = _send(
        "GET", f"{base.rstrip('/')}/res/v1/web/search", timeout, params={"q": query, "count": n}, headers=headers
    )
    # Brave marks query terms in snippets with <strong>; the model wants plain text.
    return [
        _result(r.get("title"), r.get("url"), _strip_tags(r.get("description")))
        for r in (data.get("web") or {}).get("results") or []
    ]


def _searxng(base: str, query: str, n: int, timeout: float) -> list[dict]:
    data = _send("GET", f"{base.rstrip('/')}/search", timeout, params={"q": query, "format": "json"})
    return [_result(r.get("title"), r.get("url"), r.get("content")) for r in data.get("results") or []][:n]


BACKENDS = {
    "tavily": SearchBackend("tavily", "TAVILY_API_KEY", _tavily),
    "brave": SearchBackend("brave", "BRAVE_API_KEY", _brave),
    "searxng": SearchBackend("searxng", "SEARXNG_URL", _searxng),
}


def search_backend() -> tuple[SearchBackend | None, str | None]:
    """The backend web_search uses, or None and the reason none can be used."""
    chosen = os.environ.get("WEB_SEARCH_BACKEND", "").strip().lower()
    if chosen:
        backend = BACKENDS.get(chosen)
        if backend is None:
            return None, f"WEB_SEARCH_BACKEND={chosen!r} is not one of {', '.join(BACKENDS)}"
        if not getenv(backend.env):
            return None, f"WEB_SEARCH_BACKEND={chosen} but {backend.env} is not set"
        return backend, None
    for backend in BACKENDS.values():
        if getenv(backend.env):
            return backend, None
    return None, "no web search backend configured: set " + ", ".join(b.env for b in BACKENDS.values())


def web_search(args: dict, ctx: ToolContext) -> dict:
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        return {"results": [], "error": "query must be a non-empty string"}
    n = min(max(int(args.get("max_results") or 5), 1), MAX_RESULTS)
    backend, reason = search_backend()
    if backend is None:
        return {"results": [], "error": reason}
    try:
        results = backend.search(getenv(backend.env), query.strip(), n, _timeout(ctx))
    except WebError as e:
        return {"results": [], "error": f"{backend.name} search failed: {e}"}
    return {"results": results, "error": None}


def _send(method: str, url: str, timeout: float, **kwargs) -> dict:
    """One JSON API call, retrying rate limits, server errors and dropped connections a couple of times."""
    attempts = 3
    for attempt in range(attempts):
        last = attempt == attempts - 1
        try:
            resp = httpx.request(method, url, timeout=timeout, **kwargs)
        except httpx.HTTPError as e:
            if last:
                raise WebError(f"{type(e).__name__}: {e}") from None
            time.sleep(2**attempt)
            continue
        if (resp.status_code == 429 or resp.status_code >= 500) and not last:
            time.sleep(_retry_after(resp, 2**attempt))
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


def _retry_after(resp: httpx.Response, default: float) -> float:
    try:
        return min(max(float(resp.headers.get("retry-after", default)), 0.0), 10.0)
    except ValueError:
        return default


def _result(title, url, description) -> dict:
    return {"title": str(title or "").strip(), "url": str(url or ""), "description": str(description or "").strip()}


def _strip_tags(text) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", str(text or "")))


# ---------------------------------------------------------------- web_extract


def web_extract(args: dict, ctx: ToolContext) -> dict:
    urls = args.get("urls")
    if urls is None and "url" in args:  # models sometimes pass the singular form
        urls = [args["url"]]
    if isinstance(urls, str):
        urls = [urls]
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) and u.strip() for u in urls):
        return {"results": [], "error": "urls must be a non-empty list of URL strings"}
    max_urls = _env_int("WEB_EXTRACT_MAX_URLS", 10)
    if len(urls) > max_urls:
        return {"results": [], "error": f"at most {max_urls} URLs per call (got {len(urls)})"}
    limit = max(ctx.settings.max_output_chars // len(urls), 1000)

    def one(url: str) -> dict:
        return extract_url(url.strip(), ctx.settings.allow_private_urls, _timeout(ctx), limit)

    with ThreadPoolExecutor(max_workers=min(len(urls), 5)) as pool:
        results = list(pool.map(one, urls))
    failed = [r for r in results if r["error"]]
    error = None
    if len(failed) == len(results):
        error = failed[0]["error"] if len(failed) == 1 else f"all {len(failed)} URLs failed"
    return {"results": results, "error": error}


def extract_url(url: str, allow_private: bool, timeout: float, limit: int) -> dict:
    """Fetch one page and turn it into readable text; failures are reported in the entry, never raised."""
    entry = {"url": url, "final_url": url, "title": "", "content": "", "error": None}
    try:
        final_url, content_type, body = fetch(url, allow_private, timeout, _env_int("WEB_EXTRACT_MAX_BYTES", 5_000_000))
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


def fetch(url: str, allow_private: bool, timeout: float, max_bytes: int) -> tuple[str, str, bytes]:
    """GET url following redirects by hand, so each hop is checked by url_policy before any connection to it.

    Returns (final URL, content type, body).
    """
    with httpx.Client(timeout=timeout, follow_redirects=False, headers={"User-Agent": USER_AGENT}) as client:
        for _ in range(MAX_REDIRECTS + 1):
            resp = _connect(client, url, resolve_url(url, allow_private))
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
    for i, address in enumerate(addresses):
        try:
            return client.send(client.build_request("GET", **_pinned(url, address)), stream=True)
        except httpx.ConnectError:
            if i == len(addresses) - 1:
                raise
    raise AssertionError("resolve_url returns at least one address")


def _pinned(url: str, address: str) -> dict:
    """Request arguments that connect to the checked address, so a second DNS answer cannot differ."""
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
    return min(float(os.environ.get("WEB_TIMEOUT") or 30), ctx.settings.request_timeout)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else default


WEB_SEARCH = register(
    Tool(
        name="web_search",
        description="Search the web. Returns the top results, each with title, url and a short description.",
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "The search query."},
                "max_results": {"type": "integer", "description": f"How many results (1-{MAX_RESULTS}, default 5)."},
            },
            "required": ["query"],
        },
        handler=web_search,
        unavailable=lambda settings: search_backend()[1],
    )
)
WEB_EXTRACT = register(
    Tool(
        name="web_extract",
        description=(
            "Fetch web pages and return their main content as markdown text, with the page title. "
            "Each URL gets its own result or error."
        ),
        parameters={
            "type": "object",
            "properties": {
                "urls": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "http(s) URLs of the pages to read.",
                }
            },
            "required": ["urls"],
        },
        handler=web_extract,
    )
)
