"""`--export` through the real CLI: every format written from a real run, read back by its consumer's own parser."""

from __future__ import annotations

import json
from pathlib import Path

import atif
import pytest
from cli_helpers import assert_clean_exit, read_jsonl, run_cli, write_dataset
from datasets import load_dataset
from export_helpers import NEW_BATCH, RUN, batch_records, copy_run, export_cli, make_run, openai_line_to_trajectory
from scripted_server import ScriptedServer
from test_seeded_run import _thinking

from agentbatch.export import openai_chat
from trajectory import to_openai_messages

ALL = "openai,llama_factory,hermes,atif,parquet,inspect"
TRAINING_FORMATS = ("openai", "llama_factory", "hermes", "atif", "parquet")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A real run, exported once in every format by the CLI; the run's own files are compared before and after."""
    run_dir = make_run(tmp_path_factory.mktemp("export"))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    done = export_cli(run_dir, f"--export={ALL}")
    assert_clean_exit(done)
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before, "an export never changes the run's own files"
    return run_dir


def test_every_format_is_written_with_a_report(exported):
    report = json.loads((exported / "export" / "report.json").read_text())
    n = len(batch_records(exported))
    assert set(report) == set(ALL.split(","))
    for fmt in TRAINING_FORMATS:
        assert report[fmt]["source"]["trajectories"] == n and report[fmt]["written"] == n, fmt
        assert report[fmt]["filtered"] == {}
    assert not [p for p in (exported / "export").iterdir() if p.name.startswith(".")], "no temporary directory left"


@pytest.mark.parametrize("fmt", TRAINING_FORMATS)
def test_every_format_loads_with_datasets(exported, tmp_path, fmt):
    ds = load_dataset(str(exported / "export" / fmt), split="train", cache_dir=str(tmp_path))
    assert len(ds) == len(batch_records(exported))


def test_parquet_carries_old_and_new_fields_in_one_schema(exported, tmp_path):
    ds = load_dataset(str(exported / "export" / "parquet"), split="train", cache_dir=str(tmp_path))
    records = batch_records(exported)
    assert ds["prompt_index"] == [r["prompt_index"] for r in records]
    for row, record in zip(ds, records, strict=True):
        assert [t["value"] for t in row["conversations"]] == [t["value"] for t in record["conversations"]]
        assert row["reward"] == record.get("reward") and row["passed"] == record.get("passed")
        assert row["usage"]["cost"] == record["usage"].get("cost")
        assert row["sample_index"] == record["sample_index"]
        extra = {
            "identity": record["identity"],
            "check": record["check"],
            "duration_seconds": record["duration_seconds"],
        }
        assert json.loads(row["extra"]) == extra, "only its row's identity, check and duration lie outside the columns"
        for cell, turn in zip(row["conversations"], record["conversations"], strict=True):
            assert (json.loads(cell["extra"]) if cell["extra"] else {}) == (
                {"logprobs": turn["logprobs"]} if "logprobs" in turn else {}
            )
    card = (exported / "export" / "parquet" / "README.md").read_text()
    assert "configs:" in card and "anthropic/claude-sonnet-4.6" in card and "| `reward` |" in card


def test_openai_lines_round_trip_through_our_trajectory_identically(exported):
    lines = read_jsonl(exported / "export" / "openai" / "data.jsonl")
    records = batch_records(exported)
    assert len(lines) == len(records)
    for line, record in zip(lines, records, strict=True):
        back = openai_line_to_trajectory(line)
        assert openai_chat.to_line(back) == line
        # Lossless: the conversation with its logprobs, and the outcome.
        assert back["conversations"] == record["conversations"]
        assert {k: back[k] for k in ("sample_index", "reward", "passed", "check")} == {
            k: record[k] for k in ("sample_index", "reward", "passed", "check")
        }
        assert json.loads(back["tools"]) == json.loads(record["tools"])


def test_openai_messages_follow_the_chat_format(exported):
    lines = read_jsonl(exported / "export" / "openai" / "data.jsonl")
    parallel = next(line for line in lines if line["messages"][0]["content"] == "p-parallel")
    call = parallel["messages"][1]
    assert call["role"] == "assistant" and call["reasoning_content"] == "two" and call["content"] == ""
    assert [c["function"]["arguments"] for c in call["tool_calls"]] == [
        '{"command": "echo one"}',
        '{"command": "echo two"}',
    ]
    assert [m["role"] for m in parallel["messages"][2:4]] == ["tool", "tool"]
    assert {m["tool_call_id"] for m in parallel["messages"][2:4]} == {c["id"] for c in call["tool_calls"]}
    assert all(t["type"] == "function" and "parameters" in t["function"] for t in parallel["tools"])


def test_atif_documents_validate_with_the_atif_package(exported):
    files = sorted((exported / "export" / "atif" / "trajectories").glob("*.json"))
    assert len(files) == len(batch_records(exported))
    docs = [atif.Trajectory.model_validate_json(f.read_text()) for f in files]
    by_prompt = {}
    for doc in docs:
        by_prompt.setdefault(doc.steps[0].message, []).append(doc)
    parallel = by_prompt["p-parallel"][0]
    agent = parallel.steps[1]
    assert agent.source == "agent" and agent.reasoning_content == "two"
    assert [c.arguments for c in agent.tool_calls] == [{"command": "echo one"}, {"command": "echo two"}]
    assert {r.source_call_id for r in agent.observation.results} == {c.tool_call_id for c in agent.tool_calls}
    bad = by_prompt["p-badjson"][0].steps[1].tool_calls[0]
    assert bad.arguments == {} and bad.extra == {"raw_arguments": "{not json"}
    checked = [d for d in docs if d.extra["check"]["status"] != "none"]
    assert checked and all(d.final_metrics.total_cost_usd is not None for d in docs)


def test_llama_factory_turns_sit_where_it_requires(exported):
    export = exported / "export" / "llama_factory"
    info = json.loads((export / "dataset_info.json").read_text())
    assert info == {
        RUN: {
            "file_name": "data.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
        }
    }
    lines = read_jsonl(export / "data.jsonl")
    for line in lines:
        turns = line["conversations"]
        assert len(turns) % 2 == 0
        for i, t in enumerate(turns):  # LLaMA-Factory: human/observation at odd positions (1-based), model at even
            assert t["from"] in (("human", "observation") if i % 2 == 0 else ("gpt", "function_call"))
        assert all("name" in tool and "parameters" in tool for tool in json.loads(line["tools"]))
    parallel = next(line["conversations"] for line in lines if line["conversations"][0]["value"] == "p-parallel")
    call = parallel[1]["value"]
    assert call.startswith("<think>\ntwo\n</think><tool_call>") and call.endswith("</tool_call>")
    payload = json.loads(call.split("<tool_call>", 1)[1].removesuffix("</tool_call>"))
    assert payload == [
        {"name": "terminal", "arguments": {"command": "echo one"}},
        {"name": "terminal", "arguments": {"command": "echo two"}},
    ]
    assert len(json.loads(parallel[2]["value"])) == 2, "both results in one observation"
    ctx = next(line["conversations"] for line in lines if line["conversations"][0]["value"] == "p-ctx")
    assert ctx[-1]["from"] == "function_call", "results nobody answered are dropped so the model's turn ends it"


def test_hermes_lines_are_the_original_runners_rendering(exported):
    lines = read_jsonl(exported / "export" / "hermes" / "data.jsonl")
    assert set(lines[0]) == {
        "prompt_index",
        "conversations",
        "metadata",
        "completed",
        "partial",
        "api_calls",
        "toolsets_used",
        "tool_stats",
        "tool_error_counts",
        "sample_index",
        "extra",
    }
    parallel = next(line["conversations"] for line in lines if line["conversations"][1]["value"] == "p-parallel")
    assert parallel[0]["from"] == "system" and "<tools>\n[" in parallel[0]["value"]
    tools = json.loads(parallel[0]["value"].split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
    assert all(set(t) == {"name", "description", "parameters", "required"} for t in tools)
    gpt = parallel[2]["value"]
    assert gpt.startswith("<think>\ntwo\n</think>\n<tool_call>\n")
    calls = [json.loads(block.split("\n</tool_call>")[0]) for block in gpt.split("<tool_call>\n")[1:]]
    assert calls == [
        {"name": "terminal", "arguments": {"command": "echo one"}},
        {"name": "terminal", "arguments": {"command": "echo two"}},
    ]
    assert parallel[3]["from"] == "tool" and parallel[3]["value"].count("<tool_response>") == 2
    response = json.loads(parallel[3]["value"].split("<tool_response>\n")[1].split("\n</tool_response>")[0])
    assert set(response) == {"tool_call_id", "name", "content"} and isinstance(response["content"], dict)
    plain = next(line["conversations"] for line in lines if line["conversations"][1]["value"] == "p-default")
    assert plain[2]["value"].startswith("<think>\n"), "every gpt turn opens with a think block"


def test_filters_are_applied_and_counted(exported, tmp_path):
    run_dir = copy_run(exported, tmp_path)
    done = export_cli(run_dir, "--export=openai", "--export_completed_only", "--export_min_turns=2")
    assert_clean_exit(done)
    records = batch_records(run_dir)
    report = json.loads((run_dir / "export" / "report.json").read_text())["openai"]
    not_completed = sum(1 for r in records if not r["completed"])
    few = sum(1 for r in records if r["completed"] and sum(t["from"] == "gpt" for t in r["conversations"]) < 2)
    assert report["filtered"] == {"not_completed": not_completed, "too_few_turns": few}
    assert report["written"] == len(records) - not_completed - few
    assert len(read_jsonl(run_dir / "export" / "openai" / "data.jsonl")) == report["written"]
    assert "filtered: " in done.stderr

    done = export_cli(run_dir, "--export=openai", "--export_passed_only", "--export_no_tool_errors")
    assert_clean_exit(done)
    report = json.loads((run_dir / "export" / "report.json").read_text())["openai"]
    kept = [r for r in records if not any(r["tool_error_counts"].values()) and r.get("passed") is True]
    assert report["written"] == len(kept) > 0, "a re-export replaces the earlier one"
    assert report["filtered"]["no_verdict"] == sum(
        1 for r in records if r.get("passed") is None and not any(r["tool_error_counts"].values())
    )
    lines = read_jsonl(run_dir / "export" / "openai" / "data.jsonl")
    assert lines == [openai_chat.to_line(r) for r in kept]


def test_a_killed_run_exports_and_secrets_never_reach_an_export(exported, tmp_path):
    run_dir = copy_run(exported, tmp_path)
    secret = "tok-export-0123456789"
    record = batch_records(run_dir)[0]
    record["conversations"][0]["value"] += f" (the key is {secret})"
    with open(run_dir / f"batch_{NEW_BATCH + 50}.jsonl", "w") as f:
        odd = dict(record, prompt_index=98)
        odd["conversations"] = [
            dict(t, value=t["value"] + "\ud800") if t["from"] == "gpt" else t for t in record["conversations"]
        ]
        f.write(json.dumps(record) + "\n" + json.dumps(odd) + "\n")  # a lone surrogate, as the endpoint sent it
        f.write('{"prompt_index": 99, "conversa')  # a kill tore the last line
    done = export_cli(run_dir, f"--export={ALL}", env={"SOME_SERVICE_TOKEN": secret})
    assert_clean_exit(done)
    report = json.loads((run_dir / "export" / "report.json").read_text())
    assert report["openai"]["source"]["not_json"] == 1
    for path in (run_dir / "export").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


def test_a_reexport_and_another_runs_export_load_their_own_rows_from_one_cache(exported, tmp_path):
    """`datasets` keys its cache of a folder with a card by the folder's name and the card: the card changes
    with the rows, so a re-export, or another run's export in a folder of the same name, is never stale."""
    cache = str(tmp_path / "cache")  # one cache directory, one process, as a training script has

    def loaded(run_dir: Path) -> dict[str, int]:
        return {
            f: len(load_dataset(str(run_dir / "export" / f), split="train", cache_dir=cache)) for f in TRAINING_FORMATS
        }

    def written(run_dir: Path) -> dict[str, int]:
        report = json.loads((run_dir / "export" / "report.json").read_text())
        return {f: report[f]["written"] for f in TRAINING_FORMATS}

    formats = f"--export={','.join(TRAINING_FORMATS)}"
    run = copy_run(exported, tmp_path / "first")
    assert_clean_exit(export_cli(run, formats))
    everything = written(run)
    assert loaded(run) == everything
    assert_clean_exit(export_cli(run, formats, "--export_passed_only"))
    passed = written(run)
    assert all(0 < passed[f] < everything[f] for f in TRAINING_FORMATS), passed
    assert loaded(run) == passed
    other = copy_run(exported, tmp_path / "second")
    for batch in sorted(other.glob("batch_*.jsonl"))[1:]:
        batch.unlink()  # another run: fewer rows, the same folder names
    assert_clean_exit(export_cli(other, formats))
    assert loaded(other) == written(other) != passed
    assert loaded(run) == passed


def test_a_lone_surrogate_in_a_calls_arguments_is_a_question_mark_in_every_export(exported, tmp_path):
    run_dir = copy_run(exported, tmp_path)
    record = next(r for r in batch_records(run_dir) if r["conversations"][0]["value"] == "p-parallel")
    odd = dict(record, prompt_index=97)
    odd["conversations"] = [
        # The escapes as a model writes them in its arguments: text in the line, surrogates once parsed.
        dict(t, tool_calls=[dict(c, arguments='{"command": "echo \\ud800 and \\udfff"}') for c in t["tool_calls"]])
        if t.get("tool_calls")
        else t
        for t in record["conversations"]
    ]
    with open(run_dir / f"batch_{NEW_BATCH + 50}.jsonl", "w") as f:
        f.write(json.dumps(odd) + "\n")
    assert_clean_exit(export_cli(run_dir, f"--export={ALL}"))
    out = run_dir / "export"
    for fmt in TRAINING_FORMATS:  # each loads whole, as before
        assert len(load_dataset(str(out / fmt), split="train", cache_dir=str(tmp_path / fmt))) == len(
            batch_records(run_dir)
        ), fmt
    docs = [atif.Trajectory.model_validate_json(f.read_text()) for f in (out / "atif" / "trajectories").glob("*.json")]
    arguments = [c.arguments for d in docs for s in d.steps for c in s.tool_calls or ()]
    assert arguments.count({"command": "echo ? and ?"}) == 2
    from inspect_ai.log import read_eval_log

    (log,) = (read_eval_log(str(p)) for p in (out / "inspect").glob("*.eval"))
    calls = [c.arguments for s in log.samples for m in s.messages for c in getattr(m, "tool_calls", None) or ()]
    assert calls.count({"command": "echo ? and ?"}) == 2
    for fmt in ("llama_factory", "hermes"):
        text = (out / fmt / "data.jsonl").read_text()
        assert text.count('\\"echo ? and ?\\"') == 2 and "\\ud8" not in text.lower(), fmt


def test_export_at_the_end_of_every_session(tmp_path):
    script = {"first": [_thinking("one")], "second": [_thinking("two")]}
    with ScriptedServer(script=script) as srv:
        dataset = write_dataset(tmp_path / "ds.jsonl", ["first"])
        args = [f"--dataset_file={dataset}", "--batch_size=2", "--run_name=sessions", f"--output_dir={tmp_path}"]
        args += ["--num_workers=1", "--export=openai,parquet"]
        assert_clean_exit(run_cli(args, tmp_path, srv))
        out = tmp_path / "sessions" / "export"
        assert len(read_jsonl(out / "openai" / "data.jsonl")) == 1
        write_dataset(dataset, ["first", "second"])
        done = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(done)
    lines = read_jsonl(out / "openai" / "data.jsonl")
    assert [line["messages"][0]["content"] for line in lines] == ["first", "second"]
    assert json.loads((out / "report.json").read_text())["parquet"]["written"] == 2
    assert "export openai: 2 written" in done.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--export=openai,csv"], "--export: unknown format 'csv'; choose from openai, llama_factory"),
        (["--export=openai", "--export_min_turns=-1"], "--export_min_turns must be a whole number"),
    ],
)
def test_bad_export_flags_are_one_line_errors(tmp_path, flags, message):
    done = run_cli(["--run_name=none", f"--output_dir={tmp_path}", *flags], tmp_path)
    assert_clean_exit(done, 2)
    assert done.stderr.startswith(f"error: {message}") and done.stderr.count("\n") == 1, done.stderr


def test_nothing_to_export_and_a_missing_extra_are_one_line_errors(tmp_path):
    done = run_cli(["--run_name=none", f"--output_dir={tmp_path}", "--export=openai"], tmp_path)
    assert_clean_exit(done, 2)
    assert "nothing to export" in done.stderr and not (tmp_path / "none").exists()
    blocked = (
        "import sys; sys.modules['pyarrow'] = None; import batch_runner; "
        f"sys.argv = ['batch-runner', '--run_name=x', '--output_dir={tmp_path}', '--export=parquet']; batch_runner.cli()"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", blocked], cwd=Path(__file__).parents[1], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: --export=parquet needs pyarrow: pip install 'batch-runner[export]' (from a checkout: pip install -e '.[export]')"
    )


def test_to_openai_messages_keeps_reasoning_apart_from_content():
    turns = [
        {"from": "human", "value": "q"},
        {"from": "gpt", "value": "<think>\nr\n</think>", "tool_calls": [{"id": "a", "name": "t", "arguments": "{}"}]},
        {"from": "tool", "value": "out", "tool_call_id": "a", "name": "t"},
        {"from": "gpt", "value": "plain"},
    ]
    assert to_openai_messages(turns) == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "r",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "t", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "out"},
        {"role": "assistant", "content": "plain"},
    ]
