"""web_search against fake search services and web_extract against real pages, all on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_site import FakeSite, html_reply, json_reply, redirect
from helpers import make_ctx as context

from agentbatch.errors import FatalError
from agentbatch.tools import url_policy
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings, from_environment, private_networks

TOOLS = load_tools()

FIXTURES = Path(__file__).parent / "fixtures" / "web"
ARTICLE = (FIXTURES / "article.html").read_bytes()
BIG_PAGE = b"<html><body><p>" + b"lorem ipsum " * 20_000 + b"</p></body></html>"
ENV_VARS = (
    "TAVILY_API_KEY",
    "TAVILY_BASE_URL",
    "BRAVE_API_KEY",
    "BRAVE_BASE_URL",
    "SEARXNG_URL",
    "WEB_SEARCH_BACKEND",
    "WEB_EXTRACT_MAX_BYTES",
    "WEB_EXTRACT_MAX_URLS",
    url_policy.ENV_VAR,
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def site():
    servers = []

    def make(routes):
        servers.append(FakeSite(routes))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def make_ctx(**settings) -> ToolContext:
    """A context whose settings come from the flags given and the (monkeypatched) environment, as at start."""
    return context(from_environment(os.environ, **settings))


def run(tool, args: dict, ctx: ToolContext | None = None) -> tuple[dict, bool]:
    text, ok = call_tool(tool, json.dumps(args), ctx or make_ctx())
    return json.loads(text), ok


# ---------------------------------------------------------------- web_search


def test_tavily_request_and_results(site, monkeypatch):
    def search(seen):
        assert seen.method == "POST"
        assert seen.headers["authorization"] == "Bearer tvly-test-key"
        assert seen.headers["content-type"] == "application/json"
        body = json.loads(seen.body)
        assert body["query"] == "skerryvore lighthouse"
        assert body["max_results"] == 3
        assert body["search_depth"] == "basic"
        return json_reply(
            {
                "query": body["query"],
                "answer": None,
                "images": [],
                "results": [
                    {
                        "title": "Skerryvore - Wikipedia",
                        "url": "https://en.wikipedia.org/wiki/Skerryvore",
                        "content": "Skerryvore is a remote rocky islet...",
                        "score": 0.91,
                        "raw_content": None,
                    },
                    {
                        "title": "NLB",
                        "url": "https://www.nlb.org.uk/",
                        "content": "Northern Lighthouse Board",
                        "score": 0.5,
                    },
                ],
                "response_time": 0.42,
            }
        )

    fake = site({"/search": search})
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test-key")
    monkeypatch.setenv("TAVILY_BASE_URL", fake.url)
    assert TOOLS["web_search"].unavailable(from_environment(os.environ)) is None
    result, ok = run(TOOLS["web_search"], {"query": "  skerryvore lighthouse ", "max_results": 3})
    assert ok, result
    assert result == {
        "results": [
            {
                "title": "Skerryvore - Wikipedia",
                "url": "https://en.wikipedia.org/wiki/Skerryvore",
                "description": "Skerryvore is a remote rocky islet...",
            },
            {"title": "NLB", "url": "https://www.nlb.org.uk/", "description": "Northern Lighthouse Board"},
        ],
        "error": None,
    }
    assert len(fake.seen) == 1


def test_brave_request_and_results(site, monkeypatch):
    def search(seen):
        assert seen.method == "GET"
        assert seen.headers["x-subscription-token"] == "brave-key"
        assert seen.headers["accept"] == "application/json"
        assert seen.query == {"q": "tallest lighthouse scotland", "count": "20"}
        return json_reply(
            {
                "type": "search",
                "query": {"original": seen.query["q"]},
                "web": {
                    "type": "search",
                    "results": [
                        {
                            "type": "search_result",
                            "title": "Skerryvore Lighthouse",
                            "url": "https://example.org/skerryvore",
                            "description": "The <strong>tallest lighthouse</strong> in <strong>Scotland</strong> &amp; more",
                            "language": "en",
                        }
                    ],
                },
            }
        )

    fake = site({"/res/v1/web/search": search})
    monkeypatch.setenv("BRAVE_API_KEY", "brave-key")
    monkeypatch.setenv("BRAVE_BASE_URL", fake.url + "/")
    result, ok = run(TOOLS["web_search"], {"query": "tallest lighthouse scotland", "max_results": 50})
    assert ok, result
    assert result["results"] == [
        {
            "title": "Skerryvore Lighthouse",
            "url": "https://example.org/skerryvore",
            "description": "The tallest lighthouse in Scotland & more",
        }
    ]


def test_searxng_request_and_results(site, monkeypatch):
    def search(seen):
        assert seen.method == "GET"
        assert seen.query == {"q": "hynish signal tower", "format": "json"}
        results = [
            {"title": f"r{i}", "url": f"https://e.org/{i}", "content": f"c{i}", "engine": "ddg"} for i in range(8)
        ]
        return json_reply({"query": seen.query["q"], "number_of_results": 8, "results": results, "answers": []})

    fake = site({"/search": search})
    monkeypatch.setenv("SEARXNG_URL", fake.url)
    result, ok = run(TOOLS["web_search"], {"query": "hynish signal tower", "max_results": 2})
    assert ok, result
    assert result["results"] == [
        {"title": "r0", "url": "https://e.org/0", "description": "c0"},
        {"title": "r1", "url": "https://e.org/1", "description": "c1"},
    ]


def test_backend_choice():
    reason = TOOLS["web_search"].unavailable(ToolSettings())
    assert "TAVILY_API_KEY" in reason and "BRAVE_API_KEY" in reason and "SEARXNG_URL" in reason
    env = {"BRAVE_API_KEY": "b", "SEARXNG_URL": "http://127.0.0.1:9"}
    assert from_environment(env).search_backend == "brave"
    assert TOOLS["web_search"].unavailable(from_environment(env)) is None
    assert from_environment(dict(env, WEB_SEARCH_BACKEND="searxng")).search_backend == "searxng"
    # A contradictory or misspelt choice stops the run at start, naming the variable.
    with pytest.raises(FatalError, match="TAVILY_API_KEY is not set"):
        from_environment(dict(env, WEB_SEARCH_BACKEND="tavily"))
    with pytest.raises(FatalError, match="not one of"):
        from_environment(dict(env, WEB_SEARCH_BACKEND="bing"))
    assert TOOLS["web_extract"].unavailable(ToolSettings()) is None


def test_search_service_error_is_reported(site, monkeypatch):
    fake = site(
        {"/search": lambda seen: json_reply({"detail": {"error": "Unauthorized: missing or invalid API key."}}, 401)}
    )
    monkeypatch.setenv("TAVILY_API_KEY", "wrong")
    monkeypatch.setenv("TAVILY_BASE_URL", fake.url)
    result, ok = run(TOOLS["web_search"], {"query": "x"})
    assert not ok
    assert result["results"] == []
    assert "tavily search failed: HTTP 401" in result["error"] and "invalid API key" in result["error"]
    assert len(fake.seen) == 1  # client errors are not retried


def test_search_retries_server_errors(site, monkeypatch):
    calls = []

    def flaky(seen):
        calls.append(seen)
        if len(calls) == 1:
            return 503, {"Retry-After": "0", "Content-Length": "0"}, b""
        return json_reply({"results": [{"title": "t", "url": "https://u", "content": "d"}]})

    fake = site({"/search": flaky})
    monkeypatch.setenv("SEARXNG_URL", fake.url)
    result, ok = run(TOOLS["web_search"], {"query": "x"})
    assert ok and len(calls) == 2 and result["results"][0]["url"] == "https://u"


# ---------------------------------------------------------------- web_extract


@pytest.fixture
def pages(site):
    def streamed_big(seen):  # no Content-Length: the cap must hold while reading
        return 200, {"Content-Type": "text/html"}, BIG_PAGE

    return site(
        {
            "/article": lambda seen: html_reply(ARTICLE),
            "/notes.txt": lambda seen: (200, {"Content-Type": "text/plain"}, b"plain notes, line one\nline two"),
            "/old-article": redirect("/article", 301),
            "/to-private": redirect("http://10.0.0.1/admin"),
            "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
            "/loop": redirect("/loop"),
            "/big": lambda seen: html_reply(BIG_PAGE),
            "/big-streamed": streamed_big,
            "/image.png": lambda seen: (200, {"Content-Type": "image/png"}, b"\x89PNG\r\n\x1a\n"),
        }
    )


def test_extract_article_as_markdown(pages, monkeypatch):
    monkeypatch.setenv(url_policy.ENV_VAR, "127.0.0.0/8")
    result, ok = run(TOOLS["web_extract"], {"urls": [pages.url + "/article"]})
    assert ok, result
    [page] = result["results"]
    assert page["error"] is None
    assert page["title"] == "The Lighthouse Keepers of Skerryvore"
    assert "# The Lighthouse Keepers of Skerryvore" in page["content"]
    assert "automated in 1994" in page["content"]
    assert "| 1844 | Light first exhibited |" in page["content"]
    for boilerplate in ("UA-000-SHOULD-NOT-APPEAR", "font-family", "Subscribe to our newsletter", "Cookie settings"):
        assert boilerplate not in page["content"]


def test_extract_refuses_private_addresses_before_connecting(pages):
    result, ok = run(TOOLS["web_extract"], {"urls": [pages.url + "/article"]})
    assert not ok
    assert "127.0.0.1 is not a public address (loopback)" in result["error"]
    assert pages.seen == []  # refused before any connection


def test_every_redirect_hop_is_checked(pages, monkeypatch):
    monkeypatch.setenv(url_policy.ENV_VAR, "127.0.0.0/8")  # the test server may be reached, nothing else
    urls = [pages.url + p for p in ("/old-article", "/to-private", "/to-metadata")]
    result, ok = run(TOOLS["web_extract"], {"urls": urls})
    assert ok and result["error"] is None  # one of three succeeded
    followed, private, metadata = result["results"]
    assert followed["error"] is None and followed["final_url"] == pages.url + "/article"
    assert "Skerryvore" in followed["content"]
    assert "10.0.0.1 is not a public address (private)" in private["error"]
    assert private["content"] == ""
    assert "169.254.169.254 is not a public address (link-local)" in metadata["error"]
    assert sorted(s.path for s in pages.seen) == ["/article", "/old-article", "/to-metadata", "/to-private"]


def test_allow_private_setting_and_host_header(pages):
    port = pages.url.rsplit(":", 1)[1]
    ctx = make_ctx(allow_private_urls=True)
    result, ok = run(TOOLS["web_extract"], {"urls": [f"http://localhost:{port}/notes.txt"]}, ctx)
    assert ok, result
    assert result["results"][0]["content"] == "plain notes, line one\nline two"
    # The connection is pinned to the checked address while the server still sees the name asked for.
    assert pages.seen[-1].headers["host"] == f"localhost:{port}"


def test_extract_errors_are_per_url(pages, monkeypatch):
    monkeypatch.setenv(url_policy.ENV_VAR, "1")
    monkeypatch.setenv("WEB_EXTRACT_MAX_BYTES", "50000")
    names = ["/missing", "/big", "/big-streamed", "/loop", "/image.png", "/article"]
    result, ok = run(TOOLS["web_extract"], {"urls": [pages.url + n for n in names]})
    assert ok and result["error"] is None
    missing, big, streamed, loop, image, article = result["results"]
    assert missing["error"] == "HTTP 404 Not Found"
    assert big["error"] == f"the page is {len(BIG_PAGE)} bytes, over the 50000-byte limit"
    assert streamed["error"] == "the page is over the 50000-byte limit"
    assert loop["error"] == "more than 5 redirects"
    assert "unsupported content type 'image/png'" in image["error"]
    assert article["error"] is None and "Hynish" in article["content"]


def test_all_failed_sets_top_level_error(pages, monkeypatch):
    monkeypatch.setenv(url_policy.ENV_VAR, "1")
    result, ok = run(TOOLS["web_extract"], {"urls": [pages.url + "/missing", "ftp://example.org/file"]})
    assert not ok
    assert result["error"] == "all 2 URLs failed"
    assert "only http and https" in result["results"][1]["error"]
    result, ok = run(TOOLS["web_extract"], {"urls": []})
    assert not ok and "non-empty list" in result["error"]


def test_extract_output_is_capped(pages, monkeypatch):
    monkeypatch.setenv(url_policy.ENV_VAR, "1")
    ctx = make_ctx(max_output_chars=2000)
    result, ok = run(TOOLS["web_extract"], {"urls": [pages.url + "/big"]}, ctx)
    assert ok
    content = result["results"][0]["content"]
    assert len(content) < 2100 and "characters cut" in content


# ---------------------------------------------------------------- url_policy


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://10.1.2.3/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://127.0.0.1:8080/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://224.0.0.251/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://100.64.0.1/", "non-public"),
        ("http://[fd00::5]/", "private"),
    ],
)
def test_policy_refuses_non_public_addresses(url, reason):
    with pytest.raises(ValueError, match=rf"is not a public address \({reason}\)"):
        url_policy.check_url(url, ())
    url_policy.check_url(url, None)


def test_policy_allows_public_and_checks_scheme(monkeypatch):
    url_policy.check_url("https://8.8.8.8/dns-query", ())
    url_policy.check_url("http://[2606:4700:4700::1111]/", ())
    for bad in ("file:///etc/passwd", "gopher://8.8.8.8/", "http:///nohost", "javascript:alert(1)"):
        with pytest.raises(ValueError):
            url_policy.check_url(bad, None)
    with pytest.raises(ValueError, match="cannot resolve"):
        url_policy.check_url("http://no-such-host.invalid/", ())


def test_policy_env_var():
    url_policy.check_url("http://10.0.0.1/", private_networks("1"))
    with pytest.raises(ValueError):
        url_policy.check_url("http://10.0.0.1/", private_networks("0"))
    listed = private_networks("10.0.0.0/8, 127.0.0.1/32")
    url_policy.check_url("http://10.9.9.9/", listed)
    url_policy.check_url("http://127.0.0.1/", listed)
    with pytest.raises(ValueError, match="loopback"):
        url_policy.check_url("http://127.0.0.2/", listed)
    with pytest.raises(FatalError, match="not a network"):
        private_networks("intranet")
