"""A seeded `--distribution=research` batch run through the real CLI in which every sampled tool call succeeds.

Every backend is real and on 127.0.0.1: the scripted chat server (main model, vision model, moa reference
models and aggregator), a fake Tavily speaking its documented HTTP API, a site serving the pages to extract,
the image and the pages to browse, a local terminal sandbox and a headless Chromium.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, write_dataset
from scripted_server import PNG_BYTES, ScriptedServer

from agentbatch.tools import browser_session
from agentbatch.tools.settings import ToolSettings
from toolset_distributions import get_distribution, prompt_rng, sample_toolsets

pytestmark = [pytest.mark.browser, pytest.mark.slow]

N_PROMPTS = 12
TAVILY_KEY = "tvly-research-test"
TOOLSET_TOOLS = {
    "web": {"web_search", "web_extract"},
    "vision": {"vision_analyze"},
    "terminal": {"terminal"},
    "moa": {"mixture_of_agents"},
    "browser": {"browser_navigate", "browser_snapshot"},
}
FILLER = (
    "The keeper's log records the weather every four hours, the state of the lamp and the passing ships. "
    "Supplies came by boat each fortnight when the sea allowed, and in winter storms they sometimes did not. "
)


def article(i: int) -> bytes:
    """A page with enough prose for the extractor to keep, and a marker to find in the extracted text."""
    paragraphs = "".join(f"<p>Paragraph {n} of report {i}. {FILLER}</p>" for n in range(6))
    return (
        f"<!doctype html><html><head><title>Report {i}</title></head><body><nav><a href='/'>Home</a></nav>"
        f"<article><h1>Lighthouse report {i}</h1><p>Marker research-article-{i}.</p>{paragraphs}</article>"
        "</body></html>"
    ).encode()


def browse_page(i: int) -> bytes:
    return (
        f"<!doctype html><html><head><title>Browse page {i}</title></head><body><h1>Station {i}</h1>"
        f"<p>browse-marker-{i}</p><a href='/article/{i}.html'>Read report {i}</a><button>Subscribe</button>"
        "</body></html>"
    ).encode()


class Site:
    """Fake Tavily (POST /search) plus the pages and the image the tools fetch; records every request."""

    def __init__(self):
        self.seen: list[tuple[str, str, dict, bytes]] = []
        self.lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, ctype: str, body: bytes):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with site.lock:
                    site.seen.append(("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                if self.path != "/search" or self.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
                    return self._reply(401, "application/json", b'{"detail": {"error": "Unauthorized"}}')
                query = json.loads(body)["query"]
                # Tavily's documented /search response: query, answer, images, results[title,url,content,score].
                results = [
                    {
                        "title": f"{query} - result {n}",
                        "url": f"https://example.org/{n}",
                        "content": f"About {query}, item {n}.",
                        "score": 0.9 - n / 10,
                        "raw_content": None,
                    }
                    for n in range(3)
                ]
                data = {"query": query, "answer": None, "images": [], "results": results, "response_time": 0.1}
                self._reply(200, "application/json", json.dumps(data).encode())

            def do_GET(self):
                path = urlsplit(self.path).path
                with site.lock:
                    site.seen.append(("GET", path, {k.lower(): v for k, v in self.headers.items()}, b""))
                kind, _, name = path.strip("/").partition("/")
                stem = name.removesuffix(".html")
                if kind == "article" and stem.isdigit():
                    return self._reply(200, "text/html; charset=utf-8", article(int(stem)))
                if kind == "browse" and stem.isdigit():
                    return self._reply(200, "text/html; charset=utf-8", browse_page(int(stem)))
                if path == "/image.png":
                    return self._reply(200, "image/png", PNG_BYTES)
                if path == "/favicon.ico":
                    return self._reply(204, "image/x-icon", b"")
                self._reply(404, "text/html", b"<h1>not found</h1>")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def paths(self, method: str) -> list[str]:
        with self.lock:
            return [path for m, path, _, _ in self.seen if m == method]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def site():
    s = Site()
    yield s
    s.close()


def chromium_ok() -> None:
    reason = browser_session.unavailable_reason(ToolSettings().browser_executable)
    if reason is None:
        return
    if os.environ.get("BATCH_RUNNER_REQUIRE_BROWSER"):  # CI installs Chromium: never skip there
        pytest.fail(f"{reason}, but BATCH_RUNNER_REQUIRE_BROWSER is set")
    pytest.skip(reason)


def choose_seed() -> tuple[int, list[list[str]]]:
    """The first seed whose samples use every research toolset, some prompt several at once."""
    dist = get_distribution("research")
    for seed in range(1000):
        samples = [sample_toolsets(dist, prompt_rng(seed, i)) for i in range(N_PROMPTS)]
        used = {ts for s in samples for ts in s}
        if used == set(TOOLSET_TOOLS) and max(map(len, samples)) >= 4:
            return seed, samples
    raise AssertionError("no seed below 1000 samples every research toolset in 12 prompts")


def prompt_text(i: int) -> str:
    return f"Research task {i}: find out about lighthouse station {i}."


def script_for(i: int, toolsets: list[str], site_url: str) -> list[dict]:
    """First reply: one call of each sampled toolset (browser navigates); then a snapshot; then the answer."""
    calls = []
    if "web" in toolsets:
        calls.append({"name": "web_search", "arguments": {"query": f"lighthouse station {i}", "max_results": 3}})
        calls.append({"name": "web_extract", "arguments": {"urls": [f"{site_url}/article/{i}.html"]}})
    if "vision" in toolsets:
        args = {"image_url": f"{site_url}/image.png", "question": f"Vision question {i}: what does it show?"}
        calls.append({"name": "vision_analyze", "arguments": args})
    if "terminal" in toolsets:
        calls.append({"name": "terminal", "arguments": {"command": "echo ok"}})
    if "moa" in toolsets:
        calls.append({"name": "mixture_of_agents", "arguments": {"user_prompt": f"MoA question {i}: why so tall?"}})
    if "browser" in toolsets:
        calls.append({"name": "browser_navigate", "arguments": {"url": f"{site_url}/browse/{i}.html"}})
    replies = [{"content": "Let me look.", "reasoning": f"plan for task {i}", "tool_calls": calls}]
    if "browser" in toolsets:
        replies.append(
            {
                "content": "Reading the page.",
                "reasoning": f"look at page {i}",
                "tool_calls": [{"name": "browser_snapshot"}],
            }
        )
    replies.append({"content": f"Final report {i}.", "reasoning": f"summing up task {i}"})
    return replies


def live_processes(wanted) -> set[int]:
    """Live (non-zombie) processes whose /proc entry satisfies wanted(entry)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and wanted(entry):
                pids.add(int(entry.name))
        except OSError:  # it has exited since it was listed, or is not ours to read
            continue
    return pids


def our_processes(marker: str) -> set[int]:
    """Processes started by this run: their environment carries its marker."""
    return live_processes(lambda entry: marker.encode() in (entry / "environ").read_bytes())


def cmdline_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has exited since it was listed
        return b""


def chromium_processes() -> set[int]:
    """Chromium processes: the browser, its renderers, helpers and crashpad handlers."""

    def is_chromium(entry: Path) -> bool:
        exe = (entry / "cmdline").read_bytes().split(b"\0")[0]
        return b"chrom" in os.path.basename(exe).lower()

    return live_processes(is_chromium)


def test_research_run_every_sampled_tool_call_succeeds(tmp_path, site):
    chromium_ok()
    seed, samples = choose_seed()
    script = {prompt_text(i): script_for(i, ts, site.url) for i, ts in enumerate(samples)}
    # Auxiliary calls (vision, moa references and aggregator) start from their own user text: default replies.
    default = [{"content": "Auxiliary answer to: {prompt}"}]
    marker = f"research-run-{uuid.uuid4().hex}"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    write_dataset(tmp_path / "ds.jsonl", [prompt_text(i) for i in range(N_PROMPTS)])
    env = {
        "TAVILY_API_KEY": TAVILY_KEY,
        "TAVILY_BASE_URL": site.url,
        "TMPDIR": str(tmpdir),  # Chromium's per-launch config dirs land here, so its processes name this test
        "RESEARCH_RUN_MARKER": marker,
    }
    env.update(BRAVE_API_KEY="", SEARXNG_URL="", WEB_SEARCH_BACKEND="tavily")  # an empty variable counts as unset
    chromium_before = chromium_processes()
    with ScriptedServer(script=script, default_script=default) as srv:
        proc = run_cli(
            [
                "--dataset_file=ds.jsonl",
                "--batch_size=4",
                "--run_name=research",
                "--output_dir=out",
                "--distribution=research",
                f"--seed={seed}",
                "--num_workers=2",
                "--sandbox=local",
                "--allow_private_urls",
                "--moa_models=ref-a,ref-b",
                "--max_retries=1",
                "--request_timeout=30",
                "--command_timeout=30",
            ],
            tmp_path,
            srv,
            timeout=420,
            env=env,
        )
        requests = srv.requests()
    assert_clean_exit(proc)
    run = RunDir(tmp_path / "out" / "research")

    records = run.trajectories()
    assert not run.failed() and not run.discarded()
    assert sorted(r["prompt_index"] for r in records) == list(range(N_PROMPTS))
    for r in records:
        i = r["prompt_index"]
        where = f"prompt {i} ({samples[i]})"
        assert prompt_of_record(r) == prompt_text(i)
        assert r["completed"] is True and r["partial"] is False, where
        assert r["toolsets_used"] == samples[i], where
        offered = {t["function"]["name"] for t in json.loads(r["tools"])}
        expected = set().union(*(TOOLSET_TOOLS[ts] for ts in samples[i]))
        assert expected <= offered, where
        called = {name for name, s in r["tool_stats"].items() if s["count"]}
        assert called == expected, where
        tool_turns = [t for t in r["conversations"] if t["from"] == "tool"]
        assert len(tool_turns) == sum(s["count"] for s in r["tool_stats"].values()), where
        results = {t["name"]: json.loads(t["value"]) for t in tool_turns}
        for name, result in results.items():
            assert result.get("error") is None, f"{where}: {name} -> {result}"
        for name, s in r["tool_stats"].items():
            assert s["failure"] == 0 and s["success"] == s["count"], f"{where}: {name} {s}"
            assert r["tool_error_counts"][name] == 0, f"{where}: {name}"
        gpt = [t for t in r["conversations"] if t["from"] == "gpt"]
        assert gpt and all(t["value"].startswith("<think>") for t in gpt), where
        assert r["api_calls"] == (3 if "browser" in samples[i] else 2), where
        check_results(i, samples[i], results)

    tools = run.stats()["tools"]
    for name in set().union(*(TOOLSET_TOOLS[ts] for s in samples for ts in s)):
        calls = sum(r["tool_stats"][name]["count"] for r in records)
        assert tools[name]["count"] == calls > 0, name
        assert tools[name]["failure"] == 0 and tools[name]["success_rate"] == 1.0, (name, tools[name])
    unused = set(tools) - set().union(*TOOLSET_TOOLS.values())
    assert all(tools[name]["count"] == 0 for name in unused), tools

    check_backends(samples, site, requests)
    check_no_browser_left(chromium_before, marker, tmpdir)


def check_results(i: int, toolsets: list[str], results: dict) -> None:
    """Each tool's result carries what its backend served for this prompt, not just a missing error."""
    if "web" in toolsets:
        hits = results["web_search"]["results"]
        assert len(hits) == 3 and all(f"lighthouse station {i}" in h["title"] for h in hits), hits
        assert {"title", "url", "description"} <= set(hits[0]), hits[0]
        page = results["web_extract"]["results"]
        assert len(page) == 1 and f"research-article-{i}" in page[0]["content"], page
    if "vision" in toolsets:
        assert results["vision_analyze"]["analysis"].startswith(f"Auxiliary answer to: Vision question {i}:")
    if "terminal" in toolsets:
        assert results["terminal"]["output"].strip() == "ok" and results["terminal"]["exit_code"] == 0
    if "moa" in toolsets:
        moa = results["mixture_of_agents"]
        assert moa["reference_models"] == ["ref-a", "ref-b"] and not moa["failed_models"], moa
        assert f"MoA question {i}" in moa["response"], moa
    if "browser" in toolsets:
        nav = results["browser_navigate"]
        assert nav["status"] == 200 and nav["title"] == f"Browse page {i}", nav
        snapshot = results["browser_snapshot"]["snapshot"]
        assert f"browse-marker-{i}" in snapshot and "Subscribe" in snapshot, snapshot


def check_backends(samples: list[list[str]], site: Site, requests: list[dict]) -> None:
    """Every backend got exactly the calls the samples imply, in the shape its API expects."""
    with_ts = lambda ts: [i for i, s in enumerate(samples) if ts in s]  # noqa: E731
    searches = [(headers, json.loads(body)) for m, path, headers, body in site.seen if m == "POST"]
    assert sorted(body["query"] for _, body in searches) == sorted(f"lighthouse station {i}" for i in with_ts("web"))
    for headers, body in searches:
        assert headers["authorization"] == f"Bearer {TAVILY_KEY}" and body["max_results"] == 3
    gets = site.paths("GET")
    assert sorted(p for p in gets if p.startswith("/article/")) == sorted(f"/article/{i}.html" for i in with_ts("web"))
    assert sorted(p for p in gets if p.startswith("/browse/")) == sorted(
        f"/browse/{i}.html" for i in with_ts("browser")
    )

    def user_content(body: dict):
        return next((m["content"] for m in body["messages"] if m["role"] == "user"), None)

    vision = [b for b in requests if isinstance(user_content(b), list)]
    assert len(vision) == len(with_ts("vision"))
    for body in vision:
        parts = {p["type"]: p for p in user_content(body)}
        assert parts["image_url"]["image_url"]["url"] == f"{site.url}/image.png", parts
    moa = [b for b in requests if str(user_content(b)).startswith("MoA question")]
    by_model = sorted((b["model"], user_content(b)) for b in moa if b["model"] in ("ref-a", "ref-b"))
    questions = [f"MoA question {i}: why so tall?" for i in with_ts("moa")]
    assert by_model == sorted((m, q) for m in ("ref-a", "ref-b") for q in questions)
    aggregated = [b for b in moa if b["messages"][0]["role"] == "system"]
    assert sorted(user_content(b) for b in aggregated) == sorted(questions)


def check_no_browser_left(chromium_before: set[int], marker: str, tmpdir: Path) -> None:
    """No Chromium, Playwright driver or other process of the run outlives it; profiles and sandboxes are gone."""
    deadline = time.monotonic() + 10
    while True:
        ours = {
            pid for pid in chromium_processes() - chromium_before if str(tmpdir).encode() in cmdline_of(pid)
        } | our_processes(marker)
        if not ours or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not ours, {pid: cmdline_of(pid)[:200] for pid in ours}
    assert not list(tmpdir.iterdir()), list(tmpdir.iterdir())
