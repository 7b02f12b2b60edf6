"""Verified outcomes and logprobs in every export format, from a real run (checks that pass, fail, give partial
credit, time out or are absent; two samples a prompt; --logprobs), read back by each format's consumer."""

from __future__ import annotations

import json
from pathlib import Path

import atif
import pytest
from cli_helpers import assert_clean_exit, read_jsonl
from datasets import load_dataset
from export_helpers import batch_records, export_cli, make_outcome_run, openai_line_to_trajectory

from agentbatch.export import openai_chat

ALL = "openai,llama_factory,hermes,atif,parquet,inspect"
OUTCOME = ("sample_index", "reward", "passed", "check")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = make_outcome_run(tmp_path_factory.mktemp("outcomes") / "run")
    assert_clean_exit(export_cli(run_dir, f"--export={ALL}"))
    return run_dir


@pytest.fixture(scope="module")
def records(run) -> list[dict]:
    records = batch_records(run)
    statuses = {r["check"]["status"] for r in records}
    assert statuses == {"passed", "failed", "timeout", "none"} and {r["sample_index"] for r in records} == {0, 1}
    assert 0.5 in {r["reward"] for r in records}, "partial credit"
    lps = [t["logprobs"] for r in records for t in r["conversations"] if "logprobs" in t]
    assert any(None in lp["logprobs"] for lp in lps) and any(lp["token_ids"] for lp in lps)
    assert any(not lp["token_ids"] for lp in lps)
    return records


def gpt_logprobs(record: dict) -> list[dict | None]:
    return [t.get("logprobs") for t in record["conversations"] if t["from"] == "gpt"]


def without_seconds(record: dict) -> dict:
    return {k: v for k, v in record["check"].items() if k != "seconds"}


def load(run: Path, fmt: str, tmp_path: Path):
    return load_dataset(str(run / "export" / fmt), split="train", cache_dir=str(tmp_path / fmt))


def test_openai_lines_carry_the_outcome_and_each_replys_logprobs(run, records, tmp_path):
    ds = load(run, "openai", tmp_path)
    assert ds.features["reward"].dtype == "float64" and ds.features["passed"].dtype == "bool"
    for row, record in zip(ds, records, strict=True):
        # Arrow's JSON reader may parse a decimal to the float next to Python's (0.013 -> 0.013000000000000001).
        assert row["check"].pop("seconds") == pytest.approx(record["check"]["seconds"])
        assert {k: row[k] for k in OUTCOME} == {
            k: record[k] if k != "check" else without_seconds(record) for k in OUTCOME
        }
        assistant = [m["logprobs"] for m in row["messages"] if m["role"] == "assistant"]
        assert assistant == gpt_logprobs(record)
    for line, record in zip(read_jsonl(run / "export" / "openai" / "data.jsonl"), records, strict=True):
        back = openai_line_to_trajectory(line)
        assert back["conversations"] == record["conversations"]
        assert {k: back[k] for k in OUTCOME} == {k: record[k] for k in OUTCOME}
        assert openai_chat.to_line(back) == line


@pytest.mark.parametrize("fmt", ["llama_factory", "hermes"])
def test_sharegpt_formats_carry_the_outcome_as_text_their_loaders_type_alike(run, records, tmp_path, fmt):
    """LLaMA-Factory loads data.jsonl as plain JSON (no card), typing columns from the first lines it reads: the
    outcome is one JSON text column, so a reward first seen after nulls cannot fail the load."""
    path = run / "export" / fmt / "data.jsonl"
    lines = read_jsonl(path)
    reversed_path = tmp_path / "nulls_first.jsonl"  # the lines without a reward first
    order = sorted(lines, key=lambda line: json.loads(line["extra"])["reward"] is not None)
    reversed_path.write_text("".join(json.dumps(line) + "\n" for line in order))
    # Chunks of about a line: the loader types each and casts the rest to the first, as past 10 MB of lines.
    plain = load_dataset(
        "json", data_files=str(reversed_path), split="train", cache_dir=str(tmp_path / "plain"), chunksize=256
    )
    assert plain.features["extra"].dtype == "string" and plain.num_rows == len(records)
    carded = load(run, fmt, tmp_path)
    for row, record in zip(carded, records, strict=True):
        extra = json.loads(row["extra"])
        assert row["sample_index"] == record["sample_index"]
        assert {k: extra[k] for k in OUTCOME[1:]} == {k: record[k] for k in OUTCOME[1:]}
        model_turns = [t for t in row["conversations"] if t["from"] in ("gpt", "function_call")]
        if any(gpt_logprobs(record)):
            assert extra["logprobs"] == gpt_logprobs(record) and len(model_turns) == len(extra["logprobs"])
        else:
            assert "logprobs" not in extra


def test_atif_steps_carry_logprobs_in_its_metrics_and_documents_the_outcome(run, records):
    files = sorted((run / "export" / "atif" / "trajectories").glob("*.json"))
    docs = [atif.Trajectory.model_validate_json(f.read_text()) for f in files]
    assert len(docs) == len(records)
    for doc, record in zip(docs, records, strict=True):
        assert {k: doc.extra[k] for k in OUTCOME} == {k: record[k] for k in OUTCOME}
        agent = [s for s in doc.steps if s.source == "agent"]
        for step, lp in zip(agent, gpt_logprobs(record), strict=True):
            if lp is None:
                assert step.metrics is None or step.metrics.logprobs is None
                continue
            assert step.metrics.extra["tokens"] == lp["tokens"]
            assert "logprobs" not in (step.extra or {}), "carried once, in the metrics"
            if None in lp["logprobs"]:  # ATIF's logprobs are floats: the list as written goes to the extra
                assert step.metrics.logprobs is None and step.metrics.extra["logprobs"] == lp["logprobs"]
            else:
                assert step.metrics.logprobs == lp["logprobs"]
            assert step.metrics.completion_token_ids == (lp["token_ids"] or None)


def test_parquet_types_the_outcome_and_keeps_check_and_logprobs_as_json(run, records, tmp_path):
    ds = load(run, "parquet", tmp_path)
    assert ds.features["sample_index"].dtype == "int64" and ds.features["reward"].dtype == "float64"
    for row, record in zip(ds, records, strict=True):
        assert {k: row[k] for k in OUTCOME[:3]} == {k: record[k] for k in OUTCOME[:3]}
        assert json.loads(row["extra"])["check"] == record["check"]
        cells = [json.loads(t["extra"])["logprobs"] if t["extra"] else None for t in row["conversations"]]
        assert cells == [t.get("logprobs") for t in record["conversations"]]


def test_inspect_scores_each_checked_sample_by_its_reward(run, records):
    from inspect_ai.log import read_eval_log

    (path,) = (run / "export" / "inspect").glob("*.eval")
    log = read_eval_log(str(path))
    samples = {(s.input, s.epoch): s for s in log.samples}
    assert len(samples) == len(records)
    for record in records:
        sample = samples[record["conversations"][0]["value"], record["sample_index"] + 1]
        assert {k: sample.metadata[k] for k in OUTCOME} == {k: record[k] for k in OUTCOME}
        if record["reward"] is None:  # no check, or one that gave no result: not scored
            assert "check" not in sample.scores
        else:
            score = sample.scores["check"]
            assert score.value == record["reward"] and score.metadata["check"] == record["check"]
            assert score.answer == ("passed" if record["passed"] else "failed")
        assistant = [m for m in sample.messages if m.role == "assistant"]
        assert [(m.metadata or {}).get("logprobs") for m in assistant] == gpt_logprobs(record)
    rewards = [r["reward"] for r in records if r["reward"] is not None]
    check = next(s for s in log.results.scores if s.name == "check")
    assert check.scored_samples == len(rewards)
    assert check.metrics["mean"].value == pytest.approx(sum(rewards) / len(rewards))
    assert check.metrics["pass_rate"].value == pytest.approx(sum(r["passed"] is True for r in records) / len(rewards))
    answered = samples["o-answer", 1].output.choices[0].logprobs
    assert [lp.token for lp in answered.content] == list("It is 42.")
