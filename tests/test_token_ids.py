"""--token_ids: every call asks for the ids it saw and sampled; a sample's `tokens` in its trajectory line (vLLM's
and SGLang's shapes, a deliberate drift, retokenized where the endpoint sends none); and the session headers
every model call of a sample carries, with or without the flag. The real CLI against the scripted server."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from scripted_replies import IM_END, encode, render_prompt
from scripted_server import ScriptedServer
from token_helpers import calls_of, sampled, toy_tokenizer
from verify_helpers import answer, args_for, sh


def lines_by_prompt(out) -> dict[str, dict]:
    return {r["conversations"][0]["value"]: r for r in RunDir(out).trajectories()}


SCRIPT = {
    "steady": [sh("echo one"), sh("echo two"), answer("Done.")],
    # The third call's prompt renders the earlier assistant turns with a leading space: the ids drift.
    "drifts": [sh("echo one"), sh("echo two"), answer("Done.") | {"drift": True}],
}


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    data = write_dataset(tmp / "ds.jsonl", [{"prompt": p, "answer": "Done."} for p in SCRIPT])
    flags = ["--token_ids", "--logprobs", "--policy_version=step-7", "--export=tokens,parquet,openai", "--report"]
    with ScriptedServer(script=SCRIPT) as srv:
        done = run_cli(args_for(data, tmp / "out", "v", *flags), tmp, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    return lines_by_prompt(tmp / "out" / "v"), bodies, tmp / "out" / "v" / "export" / "tokens"


def test_every_call_asks_for_token_ids_and_logprobs(vllm_run):
    _, bodies, _ = vllm_run
    assert len(bodies) == 6
    assert all(b["return_token_ids"] is True and b["logprobs"] is True for b in bodies)


def test_the_masked_ids_are_exactly_what_each_call_sampled(vllm_run):
    lines, bodies, _ = vllm_run
    tokens = lines["steady"]["tokens"]
    prompts = [render_prompt(b["messages"]) for b in calls_of(bodies, "steady")]
    completions = sampled(SCRIPT["steady"])
    assert tokens["source"] == "endpoint" and tokens["drift"] is None
    assert tokens["ids"] == prompts[-1] + completions[-1]
    assert len(tokens["mask"]) == len(tokens["logprobs"]) == len(tokens["ids"])
    expected_mask = [0] * len(tokens["ids"])
    expected_logprobs: list = [None] * len(tokens["ids"])
    for p, c in zip(prompts, completions, strict=True):
        assert tokens["ids"][len(p) : len(p) + len(c)] == c
        expected_mask[len(p) : len(p) + len(c)] = [1] * len(c)
        expected_logprobs[len(p) : len(p) + len(c)] = [round(-0.01 * (n + 1), 4) for n in range(len(c))]
    assert tokens["mask"] == expected_mask
    assert tokens["logprobs"] == expected_logprobs
    assert [i for i, m in zip(tokens["ids"], tokens["mask"], strict=True) if m] == sum(completions, [])
    assert completions[-1][-1] == IM_END  # the sampled end of turn is the model's: mask 1
    assert tokens["calls"] == [
        {"prompt": len(p), "completion": len(c), "policy_version": "step-7"}
        for p, c in zip(prompts, completions, strict=True)
    ]


def test_a_drift_is_recorded_where_it_is_and_no_re_rendered_id_gets_mask_1(vllm_run):
    lines, bodies, _ = vllm_run
    tokens = lines["drifts"]["tokens"]
    prompts = [render_prompt(b["messages"], drift=i == 2) for i, b in enumerate(calls_of(bodies, "drifts"))]
    completions = sampled(SCRIPT["drifts"])
    first_reply_at = len(prompts[0])  # where the first reply's text begins, and where the re-render differs
    assert tokens["drift"] == [{"call": 2, "at": first_reply_at, "expected": completions[0][0], "got": encode(" ")[0]}]
    assert tokens["ids"] == prompts[2] + completions[2]
    # Only the last call's completion is still proven sampled: the earlier replies were re-rendered.
    assert tokens["mask"] == [0] * len(prompts[2]) + [1] * len(completions[2])
    assert all(v is None for v, m in zip(tokens["logprobs"], tokens["mask"], strict=True) if not m)


def test_the_token_export_is_read_by_pyarrow_and_datasets_exactly(vllm_run):
    import datasets
    import pyarrow.parquet as pq

    lines, _, folder = vllm_run
    table = pq.read_table(folder / "data.parquet")
    assert table.schema.field("logprobs").type.value_type == "double"
    assert table.schema.field("input_ids").type.value_type == "int32"
    loaded = datasets.load_dataset(str(folder), split="train")
    for rows in (table.to_pylist(), list(loaded)):
        by_group = {r["group"]: r for r in rows}
        assert len(rows) == 2
        for prompt, line in lines.items():
            row = by_group[line["identity"]]
            tokens = line["tokens"]
            assert (row["index"], row["sample"]) == (line["prompt_index"], 0)
            assert row["input_ids"] == tokens["ids"]
            assert row["assistant_masks"] == tokens["mask"]
            assert row["logprobs"] == tokens["logprobs"]  # float64: the very numbers the endpoint sent
            assert row["reward"] == line["reward"] == 1.0
            assert row["source"] == "endpoint"
            assert row["policy_versions"] == ["step-7"] * 3
            assert (row["drift"] is None) == (prompt == "steady")
    drifted = next(r for r in table.to_pylist() if r["drift"])
    assert json.loads(drifted["drift"]) == lines["drifts"]["tokens"]["drift"]
    # The other exports take such lines as they take any: the field is one more of the line's.
    report = json.loads((folder.parent / "report.json").read_text())
    assert report["parquet"]["written"] == report["openai"]["written"] == report["tokens"]["written"] == 2


def test_the_report_shows_the_tokens_counted_not_listed(vllm_run):
    from report_helpers import Report

    lines, _, folder = vllm_run
    report = Report(folder.parent.parent / "report.html")
    shown = {item["conversations"][0]["value"]: item["extra"]["tokens"] for item in report.items}
    for prompt, line in lines.items():
        tokens = line["tokens"]
        assert shown[prompt] == {
            "source": "endpoint",
            "ids": len(tokens["ids"]),
            "sampled": sum(tokens["mask"]),
            "calls": tokens["calls"],
            "drift": tokens["drift"],
        }


@pytest.mark.parametrize("shape", ["sglang", "sglext"])
def test_sglang_shapes_are_read_too(tmp_path, shape):
    script = {"p": [sh("echo one") | {"token_shape": shape}, answer("ok") | {"token_shape": shape}]}
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    with ScriptedServer(script=script) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", "--token_ids"), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    tokens = lines_by_prompt(tmp_path / "out" / "v")["p"]["tokens"]
    prompts = [render_prompt(b["messages"]) for b in calls_of(bodies, "p")]
    completions = sampled(script["p"])
    assert tokens["source"] == "endpoint"
    assert tokens["ids"] == prompts[1] + completions[1]
    assert [i for i, m in zip(tokens["ids"], tokens["mask"], strict=True) if m] == completions[0] + completions[1]
    assert tokens["logprobs"] == [None] * len(tokens["ids"])  # not asked for: nulls, same length
    assert [c["policy_version"] for c in tokens["calls"]] == [None, None]


@pytest.mark.parametrize("shape", ["none", "llama-server"])
def test_without_prompt_ids_every_call_is_retokenized_with_the_chat_template(tmp_path, shape):
    script = {"p": [sh("echo one") | {"token_shape": shape}, answer("ok") | {"token_shape": shape}]}
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    tokenizer = toy_tokenizer(tmp_path / "tok")
    flags = ["--token_ids", "--logprobs", f"--tokenizer={tokenizer}"]
    with ScriptedServer(script=script) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", *flags), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    tokens = lines_by_prompt(tmp_path / "out" / "v")["p"]["tokens"]
    last = calls_of(bodies, "p")[-1]
    completions = sampled(script["p"])
    # The toy template renders what the toy server does, so retokenizing finds the same ids, never a mix.
    assert tokens["source"] == "retokenized"
    assert tokens["ids"] == render_prompt(last["messages"]) + completions[1]
    assert [i for i, m in zip(tokens["ids"], tokens["mask"], strict=True) if m] == completions[0] + completions[1]
    assert tokens["logprobs"] == [None] * len(tokens["ids"])  # the endpoint's belong to ids we do not have
    assert tokens["drift"] is None


def test_a_retokenized_reply_cut_by_the_length_limit_has_no_end_of_turn_marked_sampled(tmp_path):
    # The template closes every turn with <|im_end|>; a reply cut short never sampled it.
    cut = answer("cut sho") | {"token_shape": "none", "finish_reason": "length"}
    script = {"p": [sh("echo one") | {"token_shape": "none"}, cut]}
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    flags = ["--token_ids", f"--tokenizer={toy_tokenizer(tmp_path / 'tok')}"]
    with ScriptedServer(script=script) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", *flags), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    (line,) = RunDir(tmp_path / "out" / "v").trajectories()
    assert line["stop_reason"] == "length"
    tokens = line["tokens"]
    first, second = sampled(script["p"])
    assert tokens["source"] == "retokenized" and second[-1] == IM_END
    assert tokens["ids"] == render_prompt(calls_of(bodies, "p")[-1]["messages"]) + second[:-1]
    assert [i for i, m in zip(tokens["ids"], tokens["mask"], strict=True) if m] == first + second[:-1]


def test_a_tokenizer_that_cannot_be_loaded_leaves_tokens_null_in_one_line(tmp_path):
    script = {"p": [answer("ok") | {"token_shape": "none"}]}
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    flags = ["--token_ids", f"--tokenizer={tmp_path / 'no-such-tokenizer'}"]
    with ScriptedServer(script=script) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", *flags), tmp_path, srv)
    assert_clean_exit(done)
    (line,) = RunDir(tmp_path / "out" / "v").trajectories()
    assert "tokens" in line and line["tokens"] is None
    said = [x for x in (done.stdout + done.stderr).splitlines() if "cannot retokenize" in x]
    assert len(said) == 1 and "Traceback" not in done.stderr


def test_without_the_flag_no_ids_are_asked_and_lines_have_no_tokens(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    with ScriptedServer(script={"p": [answer("ok")]}) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v"), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    assert bodies and all("return_token_ids" not in b for b in bodies)
    (line,) = RunDir(tmp_path / "out" / "v").trajectories()
    assert "tokens" not in line


def test_every_call_of_a_sample_carries_one_session_id_and_samples_differ(tmp_path):
    script = {p: [sh("echo one"), answer("ok")] for p in ("p", "q")}
    data = write_dataset(tmp_path / "ds.jsonl", ["p", "q"])
    with ScriptedServer(script=script) as srv:  # always on: no --token_ids here
        done = run_cli(args_for(data, tmp_path / "out", "v", "--samples_per_prompt=2"), tmp_path, srv)
        bodies, headers = srv.requests(), srv.request_headers()
    assert_clean_exit(done)
    assert len(bodies) == len(headers) == 8
    sessions: dict[str, list[dict]] = defaultdict(list)
    for body, h in zip(bodies, headers, strict=True):
        assert re.fullmatch(r"[A-Za-z0-9_-]{8,}", h["x-session-id"])
        assert h["x-smg-routing-key"] == h["x-session-id"]
        sessions[h["x-session-id"]].append(body)
    # 4 samples, 4 ids: each one's two calls (the first, then the one after its tool call) share it.
    assert len(sessions) == 4
    for calls in sessions.values():
        assert len({c["messages"][0]["content"] for c in calls}) == 1
        assert sorted(sum(m["role"] == "assistant" for m in c["messages"]) for c in calls) == [0, 1]


def test_a_drift_first_seen_late_still_loads_in_datasets_after_the_merge(vllm_run, tmp_path, monkeypatch):
    # datasets types `tokens.drift` from the first chunk it reads: nulls there, a list later, fails the load.
    # The merge writes a line showing a drift first (trajectory.VALUE_KINDS), as it does for tool calls.
    import datasets

    from agentbatch.run_dir.files import RunFiles
    from agentbatch.run_dir.merge import merge

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    lines, _, _ = vllm_run
    steady = [dict(lines["steady"], prompt_index=i, identity=f"s{i}") for i in range(60)]
    files = RunFiles(str(tmp_path / "run"))
    files.prepare()
    # The drift ends the older batch; the newest starts without one, so only its kind makes it a lead.
    for n, batch in enumerate((steady[:30] + [lines["drifts"]], steady[30:])):
        with open(files.paths.batch(n), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in batch)

    def load(path: str):
        return datasets.load_dataset(
            "json", data_files=path, split="train", cache_dir=str(tmp_path / "cache" / path[-8:]), chunksize=16 << 10
        )

    raw = tmp_path / "as-written.jsonl"
    raw.write_bytes(b"".join(open(p, "rb").read() for p in files.paths.batches()))
    with pytest.raises(datasets.exceptions.DatasetGenerationError):
        load(str(raw))
    assert merge(files).trajectories == 61
    loaded = load(files.paths.path("trajectories.jsonl"))
    assert loaded.num_rows == 61
    assert [r["tokens"]["drift"] for r in loaded if r["tokens"]["drift"]] == [lines["drifts"]["tokens"]["drift"]]
