"""One reader of what a run's lines mean (run_dir/reader.py), used by every consumer: the merge and the statistics,
the resume, every export and the report count the same lines the same way, know the run's own tools from
tools.json, redact through the one Redactor, and skip what is named like a run's file but is no regular file."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from cli_helpers import assert_clean_exit, read_jsonl, run_cli, thinking, write_dataset
from report_helpers import Report
from scripted_server import ScriptedServer

from trajectory import unknown_tools

ORDERS = '''
from agentbatch import tool


@tool
def lookup_order(ctx, order_id: str) -> dict:
    """Look an order up."""
    return {"status": "shipped", "order": order_id}
'''
SCRIPT = {
    "own tool": [
        {"reasoning": "r", "tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A-1"}}]},
        thinking("it shipped"),
    ],
    "built-in tool": [
        {"reasoning": "r", "tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]},
        thinking(),
    ],
    "no tool": [thinking("no tools needed")],
}
ROWS = list(SCRIPT)
ALL_FORMATS = "openai,llama_factory,hermes,atif,parquet,inspect,tokens"
ODD_FAILURE = {"identity": "odd-1", "prompt": "odd", "sample_index": "x", "usage": "u", "error": 5, "timestamp": 7}
# Lines the merge leaves out, one of each reason (and a torn last line, as a kill leaves it).
LEFT_OUT = [
    '{"conversations": "x"}',
    "[1]",
    '{"a": 1}',
    '{"conversations": [{"from": "human", "value": "q"}, "not a turn"]}',
    '{"a": ' * 100_000 + "1" + "}" * 100_000,  # nested past any sane depth (orjson would crash on it): not JSON
]


def session(base: Path, server, *flags: str, rows: list[str] = ROWS) -> object:
    (base / "orders.py").write_text(ORDERS)
    (base / "d.json").write_text(json.dumps({"mine": {"orders": 100, "file": 100}}))
    args = [
        f"--dataset_file={write_dataset(base / 'data.jsonl', rows)}",
        "--batch_size=1",
        "--run_name=run",
        f"--output_dir={base}",
        "--sandbox=local",
        f"--tools={base / 'orders.py'}",
        f"--distributions_file={base / 'd.json'}",
        "--distribution=mine",
        *flags,
    ]
    return run_cli(args, base, server)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A real run of three prompts, one calling the run's own tool (a --tools module)."""
    base = tmp_path_factory.mktemp("reader")
    with ScriptedServer(script=SCRIPT) as server:
        assert_clean_exit(session(base, server))
    return base


def copy_run(made: Path, dest: Path) -> Path:
    shutil.copytree(made, dest, ignore=shutil.ignore_patterns("*.html", "export"), dirs_exist_ok=True)
    return dest / "run"


def existing(base: Path, *flags: str, env: dict | None = None):
    return run_cli(["--run_name=run", f"--output_dir={base}", *flags], base, env=env)


def batch_lines(run: Path) -> list[dict]:
    return [r for path in sorted(run.glob("batch_*.jsonl")) for r in read_jsonl(path)]


def test_every_consumer_keeps_and_counts_the_lines_the_merge_keeps(made, tmp_path):
    """Lines of every kind the merge leaves out: the statistics, every export (the Parquet one on its columns, and
    beside another format in Python) and the report count them as the merge does, and keep the same lines, the
    one that called the run's own tool among them."""
    run = copy_run(made, tmp_path)
    own = next(r for r in batch_lines(run) if "lookup_order" in json.dumps(r["conversations"]))
    unknown = dict(own, conversations=[*own["conversations"][:1], {**own["conversations"][1], "tool_calls": [
        {"id": "c9", "name": "no_such_tool", "arguments": "{}"}]}])  # fmt: skip
    with open(run / "batch_0.jsonl", "a") as f:
        f.write("\n".join([*LEFT_OUT, json.dumps(unknown), '{"prompt_index": 1, "conversa']))
    with open(run / "failed.jsonl", "a") as f:  # any object counts there (its usage was paid): fields of any type
        f.write(json.dumps(ODD_FAILURE) + "\n" + json.dumps({"identity": "odd-2", "prompt": 5, "model": 3}) + "\n")
        f.write(json.dumps({"conversations": "x", "prompt": "p", "identity": 7}) + "\n")  # answers no row
    with ScriptedServer(script=SCRIPT) as server:  # nothing left to run: the merge and statistics again
        assert_clean_exit(session(tmp_path, server, "--resume"))
    merge = json.loads((run / "statistics.json").read_text())["merge"]
    assert merge == {"kept": 3, "filtered_unknown_tool": 1, "filtered_not_json": 2, "filtered_malformed": 4}
    counts = {"trajectories": 3, "unknown_tool": 1, "not_json": 2, "malformed": 4}
    for formats in ("openai,parquet", "parquet", ALL_FORMATS):
        done = existing(tmp_path, f"--export={formats}")
        assert_clean_exit(done)
        assert "Traceback" not in done.stderr
        assert "lines skipped: 2 not JSON, 4 not trajectories, 1 calling unknown tools" in done.stderr
        report = json.loads((run / "export" / "report.json").read_text())
        for fmt in formats.split(","):
            assert {k: report[fmt]["source"][k] for k in counts} == counts, fmt
            # Inspect's log: the failures too; tokens: none of these lines has any (the run is not --token_ids)
            assert report[fmt]["written"] == {"inspect": 5, "tokens": 0}.get(fmt, 3), fmt
    from inspect_ai.log import read_eval_log

    (log,) = (run / "export" / "inspect").glob("*.eval")
    assert [s.scores["outcome"].value for s in read_eval_log(str(log)).samples].count("failed") == 2
    kept = sorted(r["prompt_index"] for r in read_jsonl(run / "trajectories.jsonl"))  # its lead lines come first
    assert pq.read_table(run / "export" / "parquet" / "data").column("prompt_index").to_pylist() == kept
    done = existing(tmp_path, "--report")
    assert_clean_exit(done)
    assert "(6 lines shown" in done.stderr and "7 lines skipped" in done.stderr
    shown = Report(run / "report.html")
    assert shown.run()["skipped"]["trajectory"] == {"not_json": 2, "malformed": 4, "unknown_tool": 1}
    assert shown.run()["statistics"]["merge"] == merge
    assert any(item.get("tool_stats", {}).get("lookup_order") for item in shown.items), "the own tool's line"
    assert shown.run()["statistics"]["tools"] == json.loads((run / "statistics.json").read_text())["tools"]


# The fields of a failed attempt's line (run_dir/recorder.py), and values of every JSON type to give them.
FAILED_FIELDS = ("prompt_index", "sample_index", "identity", "prompt", "error", "timestamp", "batch_num", "usage")
FAILED_FIELDS += ("stop_reason", "model", "toolsets_used", "task", "conversations", "metadata")
ODD_VALUES = (None, True, -3, 1.5, "x", [1, None], {"a": [1]}, {"cost": "0.5", "total_tokens": "many"})


def test_failed_lines_of_any_shape_are_counted_and_shown_by_every_consumer(made, tmp_path):
    """Any JSON object in failed.jsonl counts (its usage was paid for): each field of the recorder's with a value of
    every JSON type, through the statistics of a session, every export and the report, without a traceback."""
    run = copy_run(made, tmp_path)
    odd = [{"identity": f"odd-{n}", "prompt": f"odd {n}", field: value} for n, (field, value) in
           enumerate((f, v) for f in FAILED_FIELDS for v in ODD_VALUES)]  # fmt: skip
    with open(run / "failed.jsonl", "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in odd)
    with ScriptedServer(script=SCRIPT) as server:
        assert_clean_exit(session(tmp_path, server, "--resume"))
    statistics = json.loads((run / "statistics.json").read_text())
    assert statistics["prompts"]["done"] == 3
    done = existing(tmp_path, f"--export={ALL_FORMATS}", "--report")
    assert_clean_exit(done)
    assert "Traceback" not in done.stderr and f"({3 + len(odd)} lines shown" in done.stderr
    report = json.loads((run / "export" / "report.json").read_text())
    assert report["inspect"]["written"] > 3 and report["openai"]["written"] == 3


# Fields of a trajectory line the rule does not type (record_shape checks only what the runner's own readers need).
UNTYPED = ("reward", "passed", "check", "task", "duration_seconds", "tokens", "a_field_of_its_own")
UNTYPED_IN = {"metadata": ("model", "timestamp", "batch_num", "task"), "usage": ("cost", "cost_usd", "other")}
UNTYPED_IN["check"] = ("status", "exit_code", "output", "seconds", "answer_matched", "rewards")
UNTYPED_IN["tokens"] = ("ids", "mask", "logprobs", "source", "calls", "drift")


def test_trajectories_and_discards_with_untyped_fields_of_any_type_go_through_every_consumer(made, tmp_path):
    """What the rule keeps, whatever it holds where it does not look: statistics, every export and the report."""
    run = copy_run(made, tmp_path)
    good = batch_lines(run)[0]
    changed = [(field, None, value) for field in UNTYPED for value in ODD_VALUES]
    changed += [(field, key, value) for field, keys in UNTYPED_IN.items() for key in keys for value in ODD_VALUES]
    lines = []
    for n, (field, key, value) in enumerate(changed):
        line = json.loads(json.dumps(good))
        line["prompt_index"], line["identity"] = 100 + n, f"untyped-{n}"
        if key is None:
            line[field] = value
        else:
            line[field] = dict(line.get(field) or {}, **{key: value})
        lines.append(line)
    with open(run / "batch_0.jsonl", "a") as f:
        f.writelines(json.dumps(line) + "\n" for line in lines)
    with open(run / "discarded.jsonl", "a") as f:
        f.writelines(json.dumps(dict(line, discard_reason="no_reasoning")) + "\n" for line in lines)
    with ScriptedServer(script=SCRIPT) as server:
        resumed = session(tmp_path, server, "--resume")
    assert_clean_exit(resumed)
    assert json.loads((run / "statistics.json").read_text())["merge"]["kept"] == 3 + len(lines)
    done = existing(tmp_path, f"--export={ALL_FORMATS}", "--report")
    assert_clean_exit(done)
    assert "Traceback" not in done.stderr and f"({3 + 2 * len(lines)} lines shown" in done.stderr


def test_the_report_shows_the_line_that_called_the_runs_own_tool(made, tmp_path):
    """The report knows the run's tools from tools.json, as the merge does: a line calling a --tools module's tool
    is shown, with its calls counted, not skipped as calling an unknown tool."""
    run = copy_run(made, tmp_path)
    done = existing(tmp_path, "--report")
    assert_clean_exit(done)
    assert "(3 lines shown" in done.stderr and "skipped" not in done.stderr
    report = Report(run / "report.html")
    assert report.run()["statistics"]["tools"]["lookup_order"]["count"] == 1
    (own,) = [item for item in report.items if "lookup_order" in item.get("tool_stats", {})]
    assert own["conversations"][1]["tool_calls"][0]["name"] == "lookup_order"
    assert_clean_exit(existing(tmp_path, "--report"))  # another process: the same page, byte for byte
    again = Report(run / "report.html")
    when = '"generated_at": "{}"'
    assert again.text.replace(when.format(again.data["generated_at"]), "") == report.text.replace(
        when.format(report.data["generated_at"]), ""
    )


def test_a_secret_and_its_fragments_reach_no_export_and_no_report(made, tmp_path):
    """A key of this environment, whole and cut (its head in one place, its tail in another), in a trajectory, a
    discard, a failed attempt and checkpoint.json: none of it in any of the six formats, nor in the report."""
    run = copy_run(made, tmp_path)
    key = "sk-test-" + "0123456789abcdef" * 2 + "XYZW"
    head, tail = key[:20], key[-14:]
    assert head not in tail and tail not in head and len(head) >= 12 and len(tail) >= 12
    lines = (run / "batch_0.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    record["conversations"][0]["value"] += f" with the key {key}"
    record["conversations"][-1]["value"] += f" (its head {head}…)"
    record["metadata"]["model"] = f"…{tail}"
    (run / "batch_0.jsonl").write_text(json.dumps(record) + "\n" + "".join(line + "\n" for line in lines[1:]))
    with open(run / "discarded.jsonl", "a") as f:
        f.write(json.dumps(dict(record, prompt_index=50, discard_reason=f"no_reasoning {tail}")) + "\n")
    with open(run / "failed.jsonl", "a") as f:
        f.write(json.dumps({"prompt": f"p {head}", "error": f"401 for {key}", "prompt_index": 51}) + "\n")
    checkpoint = json.loads((run / "checkpoint.json").read_text())
    (run / "checkpoint.json").write_text(json.dumps(dict(checkpoint, model=f"m-{head}")))
    env = {"SOME_SERVICE_TOKEN": key}
    assert_clean_exit(existing(tmp_path, f"--export={ALL_FORMATS}", env=env))
    assert_clean_exit(existing(tmp_path, "--report", env=env))
    texts = {str(p): _text_of(p) for p in (run / "export").rglob("*") if p.is_file()}
    assert {Path(p).parent.name for p in texts} >= {"openai", "llama_factory", "hermes", "trajectories", "data"}
    assert any(p.endswith(".eval") for p in texts) and any(p.endswith(".parquet") for p in texts)
    report = Report(run / "report.html")
    texts["report"] = report.text + json.dumps(report.items) + json.dumps(report.index)
    for where, text in texts.items():
        for part in (key, head, tail):
            assert part not in text, (where, part)
    assert "[REDACTED]" in texts[str(run / "export" / "openai" / "data.jsonl")]
    assert "[REDACTED]" in texts["report"]
    with ScriptedServer(script=SCRIPT) as server:  # a session with that key: its merge copies the older lines
        (tmp_path / "orders.py").write_text(ORDERS)
        args = [f"--dataset_file={tmp_path / 'data.jsonl'}", "--batch_size=1", "--run_name=run", "--resume"]
        args += [f"--output_dir={tmp_path}", "--sandbox=local", f"--tools={tmp_path / 'orders.py'}"]
        args += [f"--distributions_file={tmp_path / 'd.json'}", "--distribution=mine"]
        assert_clean_exit(run_cli(args, tmp_path, server, env=env))
    merged = (run / "trajectories.jsonl").read_text() + (run / "statistics.json").read_text()
    assert key not in merged and head not in merged and tail not in merged and "[REDACTED]" in merged


def _text_of(path: Path) -> str:
    """A file of an export as text: a Parquet shard's rows, an Inspect log as Inspect reads it, else the file."""
    if path.suffix == ".parquet":
        return json.dumps(pq.read_table(path).to_pylist(), ensure_ascii=False, default=str)
    if path.suffix == ".eval":  # a zip of compressed JSON: read by Inspect itself
        from inspect_ai.log import read_eval_log

        return read_eval_log(str(path)).model_dump_json()
    return path.read_text(encoding="utf-8", errors="replace")


def test_what_is_named_like_a_runs_file_and_is_no_regular_file_is_skipped_and_named(made, tmp_path):
    """A directory and a FIFO named like batch files (and a directory named like failed.jsonl): the report, the
    exports and a resume skip each with a warning that names it, and lose nothing (a FIFO is never opened)."""
    run = copy_run(made, tmp_path)
    (run / "batch_7.jsonl").mkdir()
    os.mkfifo(run / "batch_8.jsonl")
    (run / "failed.jsonl").unlink(missing_ok=True)
    (run / "failed.jsonl").mkdir()
    warnings = [
        f"warning: {run / 'batch_7.jsonl'} is a directory, not a file of the run: skipped",
        f"warning: {run / 'batch_8.jsonl'} is a FIFO, not a file of the run: skipped",
        f"warning: {run / 'failed.jsonl'} is a directory, not a file of the run: skipped",
    ]
    done = existing(tmp_path, "--report", "--export=openai,parquet")
    assert_clean_exit(done)
    for warning in warnings:
        assert warning in done.stderr
    assert "report: " in done.stderr and "(3 lines shown" in done.stderr
    assert len(read_jsonl(run / "export" / "openai" / "data.jsonl")) == 3
    with ScriptedServer(script=SCRIPT) as server:  # a session cannot record a failure there: it says so first
        refused = session(tmp_path, server, "--resume", rows=[*ROWS, "no tool 2"])
    assert_clean_exit(refused, 2)
    # Its one line, after what the run's start says (its own toolsets offered): nothing of a traceback.
    assert refused.stderr.splitlines()[-1] == f"error: cannot write to {run / 'failed.jsonl'}: Is a directory"
    assert "Traceback" not in refused.stderr
    (run / "failed.jsonl").rmdir()
    with ScriptedServer(script={**SCRIPT, "no tool 2": [thinking()]}) as server:  # numbered past every name
        resumed = session(tmp_path, server, "--resume", "--report", rows=[*ROWS, "no tool 2"])
    assert_clean_exit(resumed)
    assert warnings[0] in resumed.stderr and "1 to run" in resumed.stderr
    assert [r["prompt_index"] for r in read_jsonl(run / "batch_9.jsonl")] == [3]
    statistics = json.loads((run / "statistics.json").read_text())
    assert statistics["prompts"]["done"] == 4 and statistics["merge"]["kept"] == 4
    assert "(4 lines shown" in resumed.stderr


def test_a_trajectory_of_another_shape_names_no_tool_the_run_has():
    for turns in ("x", ["x"], [{"tool_calls": "x"}], [{"tool_calls": [{"name": ["a"]}]}], None):
        assert unknown_tools(turns) == {"?"}, turns
    assert unknown_tools([{"from": "gpt", "tool_calls": [{"name": "terminal"}]}]) == set()
