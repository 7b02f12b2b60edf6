"""(15) The HTML report of a 100,000-trajectory run: the report's size, the time to write it (the real CLI,
`--report` on an existing run), and in Chromium (from disk, through Playwright) the time to the first paint, to
the drawn overview, to the whole file parsed, and to a trajectory opened from the end of the list.

python bench/run_bench.py --only 15      (or: python bench/bench_report.py [N])

The corpus is its own, not (4)'s: (4) repeats one conversation, which gzip shrinks to nothing, where a real
run's text differs from line to line. Here every line's words are drawn at random from a vocabulary, so the
chunks compress as text does (about 3x), four samples a prompt, checks that pass or fail, failed tool calls,
discards and failed attempts.
"""

from __future__ import annotations

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import MIB, OUT, ROOT, report

CORPUS = "report_corpus"
SAMPLES = 4
PAINT_PROBE = r"""
import json, sys, time
from playwright.sync_api import sync_playwright
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    t0 = time.monotonic()
    page.goto(sys.argv[1], wait_until="commit", timeout=600_000)
    page.wait_for_selector("body[data-ready='1']", timeout=600_000)
    ready_wall = time.monotonic() - t0
    page.wait_for_load_state("load", timeout=600_000)
    loaded_wall = time.monotonic() - t0
    timing = page.evaluate('''() => ({
        fcp: (performance.getEntriesByName("first-contentful-paint")[0] || {}).startTime,
        index: (performance.getEntriesByName("report-index")[0] || {}).startTime,
        ready: (performance.getEntriesByName("report-ready")[0] || {}).startTime,
        parsed: performance.getEntriesByType("navigation")[0].domContentLoadedEventEnd,
        heap: performance.memory ? performance.memory.usedJSHeapSize : null,
    })''')
    last = page.evaluate("() => document.querySelector('h1').textContent")
    t1 = time.monotonic()
    page.evaluate("n => { location.hash = '#trajectories/' + n; }", int(sys.argv[2]) - 1)
    page.wait_for_selector("article.trajectory", timeout=600_000)
    opened = time.monotonic() - t1
    # Scrolling: the list moved a screen a frame for 120 frames; the longest frame says whether it stutters.
    frames = page.evaluate('''() => new Promise(done => {
        const list = document.querySelector(".vlist"), times = [];
        list.scrollTop = 0;
        let last = performance.now(), n = 0;
        function step(now) {
            times.push(now - last); last = now;
            list.scrollTop += list.clientHeight;
            if (++n < 120) requestAnimationFrame(step); else done(times.slice(1));
        }
        requestAnimationFrame(step);
    })''')
    t2 = time.monotonic()
    page.fill("input[name=q]", "zzzz-not-there")
    page.wait_for_selector(".count[data-shown='0']", timeout=600_000)
    searched = time.monotonic() - t2
    frames.sort()
    frame = {"frame_mean": sum(frames) / len(frames), "frame_p90": frames[int(0.9 * len(frames))], "frame_max": frames[-1]}
    print(json.dumps(dict(timing, **frame, ready_wall=ready_wall, loaded_wall=loaded_wall, open_last=opened,
                          search=searched, errors=errors)))
    browser.close()
"""


def synthesize_report_corpus(n: int = 100_000, per_batch: int = 1000) -> Path:
    """n stored samples of n / 4 prompts as the runner writes them, with text that varies from line to line."""
    run_dir = OUT / CORPUS
    marker = run_dir / f".complete_{n}"
    if marker.exists():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    from agentbatch import plugins
    from agentbatch.tools.registry import load_tools
    from trajectory import build_record

    plugins.load()  # the built-in tools registered, as at a run's start

    schemas = [t.schema() for t in load_tools().values()][:5]
    rng = random.Random(14)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocabulary = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(4000)]

    def words(k: int) -> str:
        return " ".join(rng.choices(vocabulary, k=k))

    discarded = open(run_dir / "discarded.jsonl", "w", encoding="utf-8")
    failed = open(run_dir / "failed.jsonl", "w", encoding="utf-8")
    prompts = {}
    for b in range(n // per_batch):
        with open(run_dir / f"batch_{b}.jsonl", "w", encoding="utf-8") as f:
            for j in range(per_batch):
                i = b * per_batch + j
                index, sample = divmod(i, SAMPLES)
                prompt = prompts.setdefault(index, f"Task {index}: " + words(rng.randint(15, 60)))
                if rng.random() < 0.01:
                    failed.write(json.dumps({"prompt_index": index, "sample_index": sample, "prompt": prompt,
                        "error": "request rejected: HTTP 400: " + words(6), "timestamp": "2026-01-15T10:30:00",
                        "batch_num": b, "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                        "cost": 0.0}, "stop_reason": "error", "model": "bench-model",
                        "toolsets_used": ["terminal", "file"]}) + "\n")  # fmt: skip
                    continue
                listing = "\n".join(
                    f"-rw-r--r-- 1 user user {rng.randint(1, 99999):>5} {words(1)}.py" for _ in range(30)
                )
                broken = rng.random() < 0.1
                source = "".join(
                    f"def {words(1)}(x):\n    return x * {rng.randint(1, 999)}  # {words(5)}\n" for _ in range(40)
                )
                result = {"error": f"FileNotFoundError: {words(3)}"} if broken else {"content": source, "error": None}
                messages = [
                    {"role": "user", "content": prompt},
                    {"role": "assistant", "content": words(12), "reasoning": words(rng.randint(20, 80)),
                     "tool_calls": [{"id": f"c{i}_0", "function": {"name": "terminal", "arguments": '{"command": "ls -l"}'}}]},
                    {"role": "tool", "tool_call_id": f"c{i}_0", "name": "terminal",
                     "content": json.dumps({"output": listing, "exit_code": 0, "error": None})},
                    {"role": "assistant", "content": "", "reasoning": words(30),
                     "tool_calls": [{"id": f"c{i}_1", "function": {"name": "read_file", "arguments": json.dumps({"path": words(1) + ".py"})}}]},
                    {"role": "tool", "tool_call_id": f"c{i}_1", "name": "read_file", "content": json.dumps(result), "ok": not broken},
                    {"role": "assistant", "content": words(rng.randint(40, 140)), "reasoning": words(40)},
                ]  # fmt: skip
                passed = rng.random() < 0.3 + 0.4 * ((index * 7919) % 100) / 100
                tokens = rng.randint(1500, 9000)
                stop = rng.choices(["answered", "max_turns", "length"], [90, 5, 5])[0]
                record = build_record(
                    prompt_index=index,
                    messages=messages,
                    batch_num=b,
                    timestamp="2026-01-15T10:30:00",
                    model="bench-model",
                    completed=stop == "answered",
                    partial=stop == "length",
                    stop_reason=stop,
                    api_calls=3,
                    toolsets=["terminal", "file"] if index % 3 else ["terminal", "file", "web"],
                    usage={"prompt_tokens": tokens - 300, "completion_tokens": 300, "total_tokens": tokens,
                           "cost": tokens * 3e-6},  # fmt: skip
                    tool_schemas=schemas,
                    sample_index=sample,
                    outcome={"reward": float(passed), "passed": passed, "check": {"status": "passed" if passed else "failed",
                             "exit_code": 0 if passed else 1, "output": words(20), "seconds": 0.5, "answer_matched": None}},
                )  # fmt: skip
                if rng.random() < 0.02:
                    discarded.write(json.dumps(dict(record, discard_reason="no_reasoning")) + "\n")
                else:
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
    discarded.close()
    failed.close()
    (run_dir / "checkpoint.json").write_text(json.dumps({"run_name": CORPUS, "state": "finished", "model": "bench-model",
        "total_prompts": n // SAMPLES, "distribution": "development", "duration_seconds": 3600.0}))  # fmt: skip
    marker.touch()
    return run_dir


def bench_report(results: dict, n: int = 100_000) -> None:
    """(15) --report over n stored samples: size, time to write, and Chromium's time to first paint."""
    run_dir = synthesize_report_corpus(n)
    source = sum(p.stat().st_size for p in run_dir.glob("*.jsonl"))
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "batch_runner.py"), f"--run_name={CORPUS}", f"--output_dir={OUT}", "--report"],
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    page = run_dir / "report.html"
    size = page.stat().st_size
    items = json.loads(
        page.read_text(encoding="utf-8", errors="replace").split('id="report-data">', 1)[1].split("</script>", 1)[0]
    )["items"]
    probe = subprocess.run(
        [sys.executable, "-c", PAINT_PROBE, page.as_uri(), str(items)], capture_output=True, text=True
    )
    if probe.returncode != 0:
        raise RuntimeError(probe.stderr)
    t = json.loads(probe.stdout.strip().splitlines()[-1])
    results["report"] = dict(t, write_s=wall, cpu_s=after.ru_utime - before.ru_utime, bytes=size, source=source, items=items,
                             maxrss=after.ru_maxrss * 1024)  # fmt: skip
    report(
        results,
        "report",
        f"(15) --report over {items:,} lines ({source / 1e6:.0f} MB of run files): written in {wall:.1f} s "
        f"(peak RSS {after.ru_maxrss * 1024 / MIB:.0f} MiB), {size / 1e6:.1f} MB; Chromium from disk: first paint "
        f"{t['fcp'] / 1000:.2f} s, overview drawn {t['ready'] / 1000:.2f} s, whole file parsed {t['parsed'] / 1000:.2f} s, "
        f"the last trajectory opened in {t['open_last']:.2f} s, a search of the list {t['search']:.2f} s, "
        f"scrolling a screen a frame: {t['frame_mean']:.1f} ms a frame on average, p90 {t['frame_p90']:.1f} ms, "
        f"{t['frame_max']:.1f} ms at most; "
        f"console errors: {len(t['errors'])}; load average {load_before:.1f} before it",
    )


if __name__ == "__main__":
    out: dict = {}
    bench_report(out, int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
