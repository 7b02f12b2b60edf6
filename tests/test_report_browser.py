"""The report of a real run in real Chromium (Playwright, from disk): every view loads with no console error and is
screenshotted to tests/artifacts/report/, the charts carry the run's numbers, the filters narrow the list to the
right lines, a trajectory opens with its tool calls, hostile text stays text, runs side by side, a large run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cli_helpers import ROOT, assert_clean_exit
from report_helpers import (
    HOSTILE_ANSWER,
    HOSTILE_PROMPT,
    HOSTILE_TOOL_TEXT,
    MEGABYTE,
    SCRIPT_B,
    Report,
    categorised_copy,
    lines_of,
    make_run,
    report_cli,
    statistics,
)

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
ARTIFACTS = ROOT / "tests" / "artifacts" / "report"
WAIT = 60_000  # ms: generous, the machine is shared

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium missing"),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    make_run(out)
    make_run(out, "model_b", SCRIPT_B)
    assert_clean_exit(report_cli(out, "model_a", "--report", "--compare=model_b"))
    return out


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


class Page:
    """A page of the report, with every console error and uncaught exception it gave."""

    def __init__(self, browser, path: Path, view: str = ""):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.as_uri() + (f"#{view}" if view else ""), timeout=WAIT)
        self.page.wait_for_selector("body[data-ready='1']", timeout=WAIT)

    def go(self, view: str) -> None:
        self.page.evaluate("v => { location.hash = v; }", f"#{view}")
        self.page.wait_for_selector(f".tab.on[data-view='{view.split('/')[0]}']", timeout=WAIT)

    def shot(self, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def shown_ids(self) -> set[int]:
        return {int(i) for i in self.page.eval_on_selector_all(".vlist .row", "rows => rows.map(r => r.dataset.id)")}

    def shown_count(self) -> int:
        return int(self.page.get_attribute(".count", "data-shown"))

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def report(browser, runs):
    page = Page(browser, runs / "model_a" / "report.html")
    yield page
    assert page.errors == [], "no console error or warning"
    page.close()


def ids_where(run_dir: Path, keep) -> set[int]:
    return {i for i, (kind, r) in enumerate(lines_of(run_dir)) if keep(kind, r)}


def test_every_view_loads_without_an_error_and_is_screenshotted(browser, runs):
    lines = lines_of(runs / "model_a")
    with_calls = next(
        i for i, (k, r) in enumerate(lines) if "r-mixed" in r.get("conversations", [{}])[0].get("value", "")
    )
    for path, views in (
        (
            runs / "model_a" / "report.html",
            ["overview", "outcomes", "tools", "usage", "problems", "trajectories", f"trajectories/{with_calls}"],
        ),
        (runs / "model_a" / "compare.html", ["compare", "prompts", "overview", "trajectories"]),
    ):
        page = Page(browser, path)
        for view in views:
            page.go(view)
            if "/" in view:
                page.page.wait_for_selector("article.trajectory .call", timeout=WAIT)
            page.shot(f"{path.stem}-{view.replace('/', '-')}")
        assert page.errors == [], (path.name, page.errors)
        page.close()
    assert len(list(ARTIFACTS.glob("*.png"))) >= 11
    # The README's picture (docs/report.png is a copy): a trajectory open beside the list, its reasoning unfolded.
    page = Page(browser, runs / "model_a" / "report.html", f"trajectories/{with_calls}")
    page.page.set_viewport_size({"width": 1100, "height": 640})
    page.page.wait_for_selector("article.trajectory .call", timeout=WAIT)
    page.page.click("details.reasoning summary")
    page.page.eval_on_selector(".detail", "d => { d.scrollTop = d.querySelector('.turn.gpt').offsetTop - 200; }")
    page.page.screenshot(path=str(ARTIFACTS / "readme.png"))
    assert page.errors == []
    page.close()


def test_the_charts_carry_the_runs_numbers(report, runs):
    stats = statistics(runs / "model_a")
    p = report.page
    bars = p.eval_on_selector_all(".stop-reasons .bar", "gs => gs.map(g => [g.dataset.label, Number(g.dataset.value)])")
    assert dict(bars) == stats["stop_reasons"]
    assert p.inner_text("[data-figure='pass_rate'] .card-value") == f"{stats['outcomes']['pass_rate'] * 100:.1f}%"
    report.go("outcomes")
    series = p.eval_on_selector_all(
        ".pass-at-k .series:not(.legend)",
        "gs => gs.map(g => [g.dataset.series, [...g.querySelectorAll('circle')].map(c => [c.dataset.x, Number(c.dataset.y)])])",
    )
    expected = {"all samples": stats["outcomes"]["pass_at_k"]}
    expected |= {f"toolset {t}": f["pass_at_k"] for t, f in stats["outcomes"]["by_toolset"].items() if f["checked"]}
    assert {name: dict(points) for name, points in series} == expected
    checks = p.eval_on_selector_all(
        ".check-counts .bar", "gs => gs.map(g => [g.dataset.label, Number(g.dataset.value)])"
    )
    o = stats["outcomes"]
    # A check that did not pass is "not passed": "failed" is the word for a failed attempt (issue 34).
    assert dict(checks) == {"passed": o["passed"], "not passed": o["not_passed"], "timed out": o["timeout"],
                            "could not run": o["error"], "without a check": o["unchecked"]}  # fmt: skip
    counts = p.eval_on_selector_all(
        ".rewards .bin", "gs => gs.map(g => [Number(g.dataset.lo), Number(g.dataset.count)])"
    )
    rewards = [
        r["reward"] for _, r in lines_of(runs / "model_a") if r.get("check", {}).get("status") in ("passed", "failed")
    ]
    assert sum(n for _, n in counts) == len(rewards) == stats["outcomes"]["checked"]
    assert (
        counts[5] == [0.5, rewards.count(0.5)]
        and counts[9][1] == rewards.count(1.0)
        and counts[0][1] == rewards.count(0.0)
    )
    report.go("tools")
    rates = p.eval_on_selector_all(
        ".tool-failures .bar", "gs => gs.map(g => [g.dataset.label, Number(g.dataset.value)])"
    )
    assert dict(rates) == {n: t["failure"] / t["count"] for n, t in stats["tools"].items() if t["count"]}
    assert dict(rates)["read_file"] > 0


def test_filters_narrow_the_list_to_the_right_lines(report, runs):
    run_dir = runs / "model_a"
    report.go("trajectories")
    p = report.page
    everything = ids_where(run_dir, lambda k, r: True)
    assert report.shown_count() == len(everything) == 27 and report.shown_ids() == everything

    def narrowed(expected: set[int]) -> None:
        p.wait_for_selector(f".count[data-shown='{len(expected)}']", timeout=WAIT)
        assert report.shown_ids() == expected

    p.select_option("select[name=outcome]", "not_passed")
    narrowed(ids_where(run_dir, lambda k, r: k != "failed" and r["check"]["status"] == "failed"))
    p.select_option("select[name=toolset]", "terminal")
    narrowed(
        ids_where(
            run_dir,
            lambda k, r: k != "failed" and r["check"]["status"] == "failed" and "terminal" in r["toolsets_used"],
        )
    )
    p.select_option("select[name=outcome]", "")
    p.select_option("select[name=toolset]", "")
    p.select_option("select[name=tool]", "read_file")
    read_file_failed = ids_where(run_dir, lambda k, r: k != "failed" and r["tool_stats"]["read_file"]["failure"] > 0)
    assert len(read_file_failed) == 3
    narrowed(read_file_failed)
    p.select_option("select[name=tool]", "")
    p.select_option("select[name=kind]", "failed")
    narrowed(ids_where(run_dir, lambda k, r: k == "failed"))
    p.select_option("select[name=kind]", "discarded")
    narrowed(ids_where(run_dir, lambda k, r: k == "discarded"))
    p.select_option("select[name=kind]", "")
    p.select_option("select[name=stop]", "answered")
    narrowed(ids_where(run_dir, lambda k, r: r.get("stop_reason") == "answered"))
    p.select_option("select[name=stop]", "")
    p.fill("input[name=q]", "R-MIXED")  # prompts and errors, in any case
    narrowed(ids_where(run_dir, lambda k, r: "r-mixed" in json.dumps(r.get("conversations", [])[:1])))
    p.fill("input[name=q]", "bytes_written")  # only in tool results: found once the turns are searched too
    narrowed(set())
    p.check("input[name=deep]")
    narrowed(ids_where(run_dir, lambda k, r: "bytes_written" in json.dumps(r.get("conversations", []))))


def test_a_trajectory_opens_with_its_tool_calls_check_and_usage(report, runs):
    lines = lines_of(runs / "model_a")
    i, record = next(
        (i, r) for i, (k, r) in enumerate(lines) if k == "trajectory" and "r-mixed" in r["conversations"][0]["value"]
    )
    report.go("trajectories")
    p = report.page
    p.click(f".vlist .row[data-id='{i}']")
    p.wait_for_selector(f"article.trajectory[data-id='{i}'] .call[data-tool='terminal']", timeout=WAIT)
    call = p.inner_text(".call[data-tool='terminal']")
    assert "echo hi > hi.txt; echo wrote" in call and "output" in call and "wrote" in call
    assert p.eval_on_selector("details.reasoning", "d => d.open") is False, "reasoning starts folded"
    p.click("details.reasoning summary")
    assert "I will call terminal" in p.inner_text("details.reasoning")
    article = p.inner_text("article.trajectory")
    assert record["check"]["status"] in article and f"total tokens\n{record['usage']['total_tokens']}" in article
    assert p.url.endswith(f"#trajectories/{i}")


def test_hostile_text_is_shown_as_text_and_runs_nothing(report, runs):
    lines = lines_of(runs / "model_a")
    hostile = next(
        i for i, (k, r) in enumerate(lines) if k == "trajectory" and r["conversations"][0]["value"] == HOSTILE_PROMPT
    )
    huge = next(
        i for i, (k, r) in enumerate(lines) if k == "trajectory" and MEGABYTE in r["conversations"][-1]["value"]
    )
    p = report.page
    report.go(f"trajectories/{hostile}")
    p.wait_for_selector(f"article.trajectory[data-id='{hostile}'] .call[data-tool='read_file']", timeout=WAIT)
    text = p.inner_text("article.trajectory")
    assert HOSTILE_PROMPT in text and HOSTILE_TOOL_TEXT in text and HOSTILE_ANSWER.strip() in text
    assert HOSTILE_PROMPT in p.inner_text(".vlist")
    report.go(f"trajectories/{huge}")
    p.wait_for_selector(f"article.trajectory[data-id='{huge}'] button.more", timeout=WAIT)
    p.click("button.more")
    shown = p.eval_on_selector_all("article.trajectory pre.content", "ps => ps.map(p => p.textContent.length)")
    assert max(shown) > 100_000, "the whole kept text, after 'show all'"
    assert "characters not shown here: the whole text is in batch_" in p.inner_text("article.trajectory")
    for view in ("overview", "usage"):  # the costliest list names the hostile prompt too
        report.go(view)
    found = p.evaluate(
        """() => ({
            pwned: window.__pwned === undefined ? null : window.__pwned,
            scripts: document.scripts.length,
            foreign: document.querySelectorAll('#app img, #app iframe, #app a, #app script, #app b, #app i').length,
            handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(a => a.name.startsWith('on'))).length,
        })"""
    )
    chunks = len(Report(runs / "model_a" / "report.html").data["chunk_starts"])
    assert found == {"pwned": None, "scripts": 3 + chunks, "foreign": 0, "handlers": 0}


def test_runs_side_by_side_and_the_prompts_one_passes_and_the_other_does_not(browser, runs):
    page = Page(browser, runs / "model_a" / "compare.html")
    p = page.page
    for i, name in enumerate(["model_a", "model_b"]):
        cells = p.eval_on_selector_all("td[data-figure='pass rate']", "tds => tds.map(t => Number(t.dataset.value))")
        assert cells[i] == statistics(runs / name)["outcomes"]["pass_rate"]
    assert "one dataset" in p.inner_text(".dataset")
    page.go("prompts")

    def prompts_after(button: str) -> list[str]:
        p.click(f"button.chip:text-is('{button}')")
        p.wait_for_selector(f"button.chip.on:text-is('{button}')", timeout=WAIT)
        return p.eval_on_selector_all(".prompt-row .text", "ts => ts.map(t => t.textContent)")

    assert prompts_after("model_a passes, model_b does not") == ["r-pass: what is 6*7?"]
    assert prompts_after("model_b passes, model_a does not") == ["r-fail: what is 6*7?"]
    assert set(prompts_after("some runs pass, some do not")) == {"r-pass: what is 6*7?", "r-fail: what is 6*7?"}
    p.click(".prompt-row .cell[data-run='1']:text-is('3/3')")  # model_b's samples of r-fail
    p.wait_for_selector(".count[data-shown='3']", timeout=WAIT)
    rows = p.eval_on_selector_all(".vlist .row", "rs => rs.map(r => r.innerText)")
    assert len(rows) == 3 and all("model_b" in r and "r-fail" in r and "passed" in r for r in rows)
    assert page.errors == []
    page.close()


def test_a_large_run_opens_with_a_short_list_in_the_page_and_its_last_line_opens(browser, runs, tmp_path):
    """5,000 lines: the list draws only the rows in view, and a line from the end (in the last chunk) opens."""
    big = tmp_path / "big"
    big.mkdir()
    source = [json.loads(line) for line in sorted((runs / "model_a").glob("batch_*.jsonl"))[0].read_text().splitlines()]
    with open(big / "batch_0.jsonl", "w") as f:
        for i in range(5000):
            f.write(json.dumps(dict(source[i % len(source)], prompt_index=i, sample_index=0)) + "\n")
    assert_clean_exit(report_cli(tmp_path, "big", "--report"))
    assert len(Report(big / "report.html").data["chunk_starts"]) > 10
    page = Page(browser, big / "report.html", "trajectories")
    p = page.page
    p.wait_for_selector(".count[data-shown='5000']", timeout=WAIT)
    assert len(page.shown_ids()) < 80, "only the rows in view are in the page"
    p.eval_on_selector(".vlist", "v => { v.scrollTop = v.scrollHeight; }")
    p.wait_for_selector(".vlist .row[data-id='4999']", timeout=WAIT)
    p.click(".vlist .row[data-id='4999']")
    p.wait_for_selector("article.trajectory[data-id='4999'] .turn", timeout=WAIT)
    assert "Prompt #4999" in p.inner_text("article.trajectory h2")
    assert page.errors == []
    page.close()
    shutil.rmtree(big)


def test_task_categories_chart_their_pass_at_k_and_filter_the_list(browser, runs, tmp_path):
    copy = categorised_copy(runs / "model_a", tmp_path / "categorised")
    assert_clean_exit(report_cli(tmp_path, copy.name, "--report"))
    by = Report(copy / "report.html").run()["by_category"]["category"]
    page = Page(browser, copy / "report.html", "outcomes")
    p = page.page
    series = p.eval_on_selector_all(
        ".pass-at-k-category .series:not(.legend)",
        "gs => gs.map(g => [g.dataset.series, [...g.querySelectorAll('circle')].map(c => [c.dataset.x, Number(c.dataset.y)])])",
    )
    assert {name: dict(points) for name, points in series} == {
        "category: arithmetic": by["arithmetic"]["pass_at_k"],
        "category: files": by["files"]["pass_at_k"],
        "difficulty: easy": Report(copy / "report.html").run()["by_category"]["difficulty"]["easy"]["pass_at_k"],
    }
    page.go("trajectories")
    p.select_option("select[name=category]", "category: arithmetic")
    expected = ids_where(copy, lambda k, r: k != "failed" and "6*7" in r["conversations"][0]["value"])
    p.wait_for_selector(f".count[data-shown='{len(expected)}']", timeout=WAIT)
    assert page.shown_ids() == expected
    page.shot("report-categories")
    assert page.errors == []
    page.close()


def test_a_run_with_no_line_yet_draws_every_view_without_an_error(browser, tmp_path):
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "checkpoint.json").write_text(json.dumps({"state": "running", "total_prompts": 5}))
    assert_clean_exit(report_cli(tmp_path, "early", "--report"))
    page = Page(browser, tmp_path / "early" / "report.html")
    for view in ("overview", "outcomes", "tools", "usage", "problems", "trajectories"):
        page.go(view)
    assert page.shown_count() == 0
    page.page.check("input[name=deep]")
    page.page.fill("input[name=q]", "anything")
    page.page.wait_for_selector(".count[data-shown='0']", timeout=WAIT)
    assert page.errors == []
    page.close()


def test_five_runs_side_by_side_choose_the_pair_to_compare(browser, runs, tmp_path):
    for n in range(3):  # copies of a real run are real runs
        shutil.copytree(runs / "model_a", tmp_path / f"copy_{n}", ignore=shutil.ignore_patterns("*.html"))
    others = ",".join([str(runs / "model_a"), str(runs / "model_b"), "copy_1", "copy_2"])
    assert_clean_exit(report_cli(tmp_path, "copy_0", f"--compare={others}"))
    page = Page(browser, tmp_path / "copy_0" / "compare.html", "prompts")
    p = page.page
    assert p.eval_on_selector_all(".prompt-head .cell", "cs => cs.map(c => c.title)") == [
        "copy_0", "model_a", "model_b", "copy_1", "copy_2"
    ]  # fmt: skip
    p.select_option("select[name=pass-a]", "2")
    p.select_option("select[name=pass-b]", "3")
    p.click(".pair-pick button")
    p.wait_for_selector(".count[data-shown='1']", timeout=WAIT)
    assert p.eval_on_selector_all(".prompt-row .text", "ts => ts.map(t => t.textContent)") == ["r-fail: what is 6*7?"]
    assert page.errors == []
    page.close()


def test_lines_whose_fields_have_another_shape_open_and_show_them(browser, runs, tmp_path):
    """Hand-edited lines (a cost that is text, token counts and toolsets of another type, a batch that is an
    object): each opens, with those fields shown as they are, never left at "Opening…"."""
    odd = tmp_path / "odd"
    shutil.copytree(runs / "model_a", odd, ignore=shutil.ignore_patterns("*.html"))
    batch = sorted(odd.glob("batch_*.jsonl"))[0]
    trajectory = json.loads(batch.read_text().splitlines()[0])
    trajectory["prompt_index"], trajectory["usage"]["cost"] = 777, "0.25 USD"
    with open(batch, "a") as f:
        f.write(json.dumps(trajectory) + "\n")
    failure = {"prompt": "odd failure", "error": "boom", "usage": {"cost": "0.50 USD", "total_tokens": "many"}}
    failure |= {"toolsets_used": "terminal", "batch_num": {"n": 1}, "timestamp": 5}
    with open(odd / "failed.jsonl", "a") as f:
        f.write(json.dumps(failure) + "\n")
    assert_clean_exit(report_cli(tmp_path, "odd", "--report"))
    lines = lines_of(odd)
    shown = {
        next(i for i, (k, r) in enumerate(lines) if k == "trajectory" and r.get("prompt_index") == 777): "0.25 USD",
        len(lines) - 1: "0.50 USD",  # failed attempts come last
    }
    page = Page(browser, odd / "report.html")
    for item, text in shown.items():
        page.go(f"trajectories/{item}")
        page.page.wait_for_selector(f"article.trajectory[data-id='{item}']", timeout=WAIT)
        assert text in page.page.inner_text("article.trajectory")
    assert "many" in page.page.inner_text("article.trajectory") and "terminal" in page.page.inner_text(
        "article.trajectory"
    )
    assert page.errors == []
    page.close()
