"""The report of a real run, read back in Python: its figures are statistics.json's, every line is in it with its
content, bad input is one line, torn or wrong-shaped lines are skipped and counted, secrets stay out, and runs of
different datasets are matched by prompt text. (What the page draws of it: test_report_browser.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
from cli_helpers import RUN_TIMEOUT, assert_clean_exit, run_cli, start_cli, write_dataset
from report_helpers import (
    MEGABYTE,
    SAMPLES,
    SCRIPT,
    SCRIPT_B,
    Report,
    categorised_copy,
    lines_of,
    make_run,
    report_cli,
    run_args,
    statistics,
    think,
)
from scripted_server import ScriptedServer
from verify_helpers import expected_pass_at_k

from agentbatch.report.pack import TEXT_CAP
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.merge import merge

SAME = ("trajectories", "completed", "partial", "max_turns_reached", "stop_reasons", "api_calls", "discarded",
        "discard_reasons", "reasoning", "tools", "tokens", "cost", "by_model", "by_toolset", "outcomes", "samples")  # fmt: skip


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report")


@pytest.fixture(scope="module")
def run(out) -> Path:
    run_dir, _ = make_run(out)
    done = report_cli(out, run_dir.name, "--report")
    assert_clean_exit(done)
    assert done.stderr.startswith(f"report: {run_dir / 'report.html'} (27 lines shown"), done.stderr
    return run_dir


@pytest.fixture(scope="module")
def report(run) -> Report:
    return Report(run / "report.html")


def test_its_figures_are_those_of_statistics_json(run, report):
    stats = statistics(run)
    assert stats["outcomes"]["pass_at_k"]["2"] > stats["outcomes"]["pass_at_k"]["1"], "a prompt passing some samples"
    mine = report.run()["statistics"]
    assert {k: mine[k] for k in SAME} == {k: stats[k] for k in SAME}
    assert mine["merge"] == stats["merge"]


def test_every_line_is_in_it_in_file_order_with_its_content(run, report):
    lines = lines_of(run)
    assert report.data["items"] == len(lines) == len(report.items) == 27
    kinds = report.data["kinds"]
    assert [kinds[k] for k in report.column("kind")] == [kind for kind, _ in lines]
    assert report.column("pindex") == [r["prompt_index"] for _, r in lines]
    assert report.column("sample") == [r["sample_index"] for _, r in lines]
    assert {r["sample_index"] for _, r in lines} == set(range(SAMPLES))
    statuses = report.data["statuses"]
    assert [statuses[s] for s in report.column("status")] == [
        r.get("check", {}).get("status", "none") for _, r in lines
    ]
    for (kind, record), item in zip(lines, report.items, strict=True):
        if kind == "failed":
            assert item == record
            continue
        assert item["check"] == record["check"] and item["usage"] == record["usage"]
        assert "tools" not in item and item["tools_offered"] == [
            t["function"]["name"] for t in json.loads(record["tools"])
        ]
        if MEGABYTE not in record["conversations"][-1]["value"]:
            assert item["conversations"] == record["conversations"]
            continue
        # A megabyte answer is kept to its head and tail, and says where the whole of it is.
        text = item["conversations"][-1]["value"]
        assert TEXT_CAP < len(text) < TEXT_CAP + 200
        whole = record["conversations"][-1]["value"]
        assert text.startswith(whole[: TEXT_CAP // 2]) and text.endswith(whole[-TEXT_CAP // 2 :])
        assert "characters not shown here: the whole text is in batch_" in text
    assert (run / "report.html").stat().st_size < 600_000, "three megabyte answers cost the page little"


def test_it_is_written_at_the_end_of_every_session(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "r-pass: what is 6*7?", "answer": "42"}])
    args = run_args(data, tmp_path, "each", "--report")
    with ScriptedServer(script=SCRIPT, default_script=[think("x")]) as srv:
        first = run_cli(args, tmp_path, srv)
        assert_clean_exit(first)
        assert Report(tmp_path / "each" / "report.html").data["items"] == SAMPLES
        again = run_cli([*args, "--samples_per_prompt=4", "--resume"], tmp_path, srv)
    assert_clean_exit(again)
    assert "report: " in again.stderr
    assert Report(tmp_path / "each" / "report.html").data["items"] == 4


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--run_name=nowhere", "--report"], "error: no run in {out}/nowhere: it does not exist or holds no"),
        (["--run_name=empty", "--report"], "error: no run in {out}/empty: it does not exist or holds no"),
        (["--report"], "error: --report needs --run_name: the run to report on"),
        (["--run_name=model_a", "--report", "--compare=nowhere"], "error: no run in {out}/nowhere:"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(run, out, flags, says):
    (out / "empty").mkdir(exist_ok=True)
    before = (run / "report.html").stat().st_mtime_ns
    done = run_cli([f"--output_dir={out}", *flags], out)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(says.format(out=out)), done.stderr
    assert not (run / "compare.html").exists() and (run / "report.html").stat().st_mtime_ns == before


def test_torn_and_wrong_shaped_lines_are_skipped_and_counted_as_the_merge_does(run, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    first = sorted(damaged.glob("batch_*.jsonl"))[0]
    a_line = json.loads(first.read_text().splitlines()[0])
    with open(first, "a") as f:
        f.write('[1]\n{"a": 1}\n{"conversations": "x"}\n')
        f.write(json.dumps(dict(a_line, conversations=[*a_line["conversations"], {"from": "gpt", "value": "",
                "tool_calls": [{"id": "c", "name": "no_such_tool", "arguments": "{}"}]}])) + "\n")  # fmt: skip
        nan = re.sub(r'"reward": [0-9.]+', '"reward": NaN', json.dumps(a_line))  # as json.dumps writes a NaN
        assert "NaN" in nan
        f.write(nan + "\n")
        f.write('{"prompt_index": 1, "conversations": [{"from": "hu')  # a kill mid-write
    checkpoint = json.loads((damaged / "checkpoint.json").read_text())
    (damaged / "checkpoint.json").write_text(json.dumps(dict(checkpoint, duration_seconds="soon", total_prompts=[])))
    with open(damaged / "discarded.jsonl", "a") as f:
        f.write('"just a string"\n{"torn')
    with open(damaged / "failed.jsonl", "a") as f:
        f.write('{"prompt": "x", "err')
    (damaged / "report.html.tmp").write_text("<html>half a report")  # a report writer killed mid-write
    done = report_cli(tmp_path, "damaged", "--report")
    assert_clean_exit(done)
    assert "8 lines skipped" in done.stderr
    assert sorted(p.name for p in damaged.glob("*report*")) == ["report.html"], "the leftover was replaced"
    report = Report(damaged / "report.html")
    merged = merge(RunFiles(str(damaged)))
    skipped = report.run()["skipped"]
    assert skipped["trajectory"] == {"not_json": merged.not_json, "malformed": merged.malformed, "unknown_tool": 1}
    assert (merged.not_json, merged.malformed, merged.unknown_tool) == (1, 3, 1)
    assert skipped["discarded"] == {"not_json": 1, "malformed": 1, "unknown_tool": 0}
    assert skipped["failed"] == {"not_json": 1, "malformed": 0, "unknown_tool": 0}
    assert report.data["items"] == len(lines_of(run)) + 1
    assert report.run()["statistics"]["merge"]["filtered_malformed"] == 3
    assert (
        report.run()["checkpoint"]["duration_seconds"] is None
        and report.run()["statistics"]["samples"]["total"] is None
    )
    # No bare NaN in the page's JSON nor in the lines it carries; the lines' gzip chunks are base64, which may
    # spell "NaN" by chance (it did, once in five full suites), so they are read decoded.
    page = re.sub(r'(<script type="application/x-gzip-base64"[^>]*>)[^<]*', r"\1", report.text)
    assert "NaN" not in page and "NaN" not in json.dumps(report.items)


def test_credentials_of_the_environment_never_reach_the_report(run, tmp_path):
    secret = "sk-live-0123456789abcdefXYZ"
    copy = tmp_path / "leaky"
    shutil.copytree(run, copy)
    batch = sorted(copy.glob("batch_*.jsonl"))[0]
    text = batch.read_text().replace("The answer is 42.", f"The answer is 42. key={secret}")
    assert secret in text
    batch.write_text(text)
    done = run_cli(
        [f"--run_name={copy.name}", f"--output_dir={tmp_path}", "--report"], tmp_path, env={"OPENAI_API_KEY": secret}
    )
    assert_clean_exit(done)
    report = Report(copy / "report.html")
    everything = report.text + json.dumps(report.items) + json.dumps(report.index)
    assert secret not in everything and secret[:12] not in everything
    assert "key=[REDACTED]" in json.dumps(report.items)


def test_runs_of_one_dataset_side_by_side(run, out):
    make_run(out, "model_b", SCRIPT_B)
    done = report_cli(out, run.name, "--compare=model_b")
    assert_clean_exit(done)
    report = Report(run / "compare.html")
    assert [r["name"] for r in report.data["runs"]] == ["model_a", "model_b"]
    assert report.data["compare"]["same_dataset"] is True
    for i, name in enumerate(["model_a", "model_b"]):
        assert report.run(i)["statistics"]["outcomes"] == statistics(out / name)["outcomes"]
    passed = _passed_by_prompt(report)
    assert passed["r-pass: what is 6*7?"] == [SAMPLES, 0] and passed["r-fail: what is 6*7?"] == [0, SAMPLES]


def test_runs_of_different_datasets_are_matched_by_prompt_text(run, out):
    # Two rows of the first run's dataset, in another order, and one of its own.
    rows = [
        {"prompt": "r-fail: what is 6*7?", "answer": "42"},
        {"prompt": "r-new"},
        {"prompt": "r-pass: what is 6*7?", "answer": "42"},
    ]
    data = write_dataset(out / "other.jsonl", rows)
    with ScriptedServer(script=SCRIPT_B, default_script=[think("x")]) as srv:
        assert_clean_exit(run_cli(run_args(data, out, "other"), out, srv))
    done = report_cli(out, run.name, "--compare=other")
    assert_clean_exit(done)
    report = Report(run / "compare.html")
    note = report.data["compare"]
    assert note["same_dataset"] is False
    assert (note["prompts_per_run"], note["prompts_in_all"], note["prompts_in_any"]) == ([9, 3], 2, 10)
    passed = _passed_by_prompt(report)
    assert passed["r-pass: what is 6*7?"] == [SAMPLES, 0] and passed["r-fail: what is 6*7?"] == [0, SAMPLES]
    assert passed["r-new"] == [0, 0]


def _passed_by_prompt(report: Report) -> dict[str, list[int]]:
    passed = report.index["side_by_side"]["passed"]
    return {text: [runs[p] for runs in passed] for p, text in enumerate(report.index["prompts"]["text"])}


def test_outcomes_by_task_category(run, tmp_path):
    copy = categorised_copy(run, tmp_path / "categorised")
    assert_clean_exit(report_cli(tmp_path, copy.name, "--report"))
    report = Report(copy / "report.html")
    by = report.run()["by_category"]
    assert set(by) == {"category", "difficulty"} and set(by["category"]) == {"arithmetic", "files"}
    for kind, figures in by["category"].items():
        samples = [r for k, r in lines_of(copy) if k != "failed" and r["metadata"]["task"]["category"] == kind]
        checked = [r for r in samples if r["check"]["status"] in ("passed", "failed")]
        per_prompt = {}
        for r in checked:
            n, c = per_prompt.get(r["prompt_index"], (0, 0))
            per_prompt[r["prompt_index"]] = (n + 1, c + r["passed"])
        assert figures["checked"] == len(checked) and figures["passed"] == sum(r["passed"] for r in checked)
        for k in ("1", "2", "3"):
            assert figures["pass_at_k"][k] == round(expected_pass_at_k(list(per_prompt.values()), int(k)), 4)
    assert by["difficulty"]["easy"]["pass_at_k"] == statistics(run)["outcomes"]["pass_at_k"]
    assert sum(report.run()["rewards"]["by_category"]["category: files"]) == by["category"]["files"]["checked"]
    labels = {report.index["strings"][c] for c in report.column("category") if c >= 0}
    assert labels == {"category: arithmetic · difficulty: easy", "category: files · difficulty: easy"}


def test_a_running_run_and_then_a_killed_one(tmp_path):
    """The report of a run while its session writes it (the lock is not in the way), and once it was killed."""
    data = write_dataset(tmp_path / "ds.jsonl", [f"slow prompt {i}" for i in range(40)])
    args = run_args(data, tmp_path, "live", "--samples_per_prompt=1", "--concurrency=2", "--num_workers=1")
    with ScriptedServer(default_script=[think("slow")], latency=0.3) as srv:
        proc = start_cli(args, tmp_path, srv)
        try:
            batch = tmp_path / "live" / "batch_0.jsonl"
            deadline = time.monotonic() + RUN_TIMEOUT
            while not (batch.exists() and batch.read_text().count("\n") >= 2) and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read()
                time.sleep(0.1)
            live = report_cli(tmp_path, "live", "--report")
            assert_clean_exit(live)
            assert proc.poll() is None, "the session was still running"
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    running = Report(tmp_path / "live" / "report.html")
    assert 2 <= running.data["items"] < 40
    assert_clean_exit(report_cli(tmp_path, "live", "--report"))
    killed = Report(tmp_path / "live" / "report.html")
    assert killed.data["items"] >= running.data["items"]
    assert killed.data["items"] == len(lines_of(tmp_path / "live"))


def test_a_run_killed_before_any_sample_finished(tmp_path):
    (tmp_path / "early").mkdir()
    (tmp_path / "early" / "checkpoint.json").write_text(json.dumps({"state": "running", "total_prompts": 5}))
    assert_clean_exit(report_cli(tmp_path, "early", "--report"))
    report = Report(tmp_path / "early" / "report.html")
    assert report.data["items"] == 0 and report.items == []
    assert report.run()["statistics"]["samples"] == {"total": 5, "done": 0, "discarded": 0, "failed": 0, "not_run": 5}


def test_two_report_writers_at_once_take_turns(run, tmp_path):
    copy = tmp_path / "twice"
    shutil.copytree(run, copy)
    both = [start_cli([f"--run_name={copy.name}", f"--output_dir={tmp_path}", "--report"], tmp_path) for _ in range(2)]
    for proc in both:
        _out, err = proc.communicate(timeout=RUN_TIMEOUT)
        assert proc.returncode == 0, err
        assert "report: " in err, err  # the second may first say it waits for the first
    assert Report(copy / "report.html").data["items"] == len(lines_of(run))
    assert not (copy / "report.html.tmp").exists()
