"""--logprobs: asked for in every agent call, stored with each assistant turn; against the scripted server and
the embedded llama.cpp server."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, sh

from agentbatch.model import local_server
from agentbatch.model.logprobs import token_logprobs


def gpt_turns(record: dict) -> list[dict]:
    return [t for t in record["conversations"] if t["from"] == "gpt"]


def test_token_logprobs_reads_what_servers_send():
    entries = [{"token": "Hi", "logprob": -0.5, "bytes": None}, {"token": "!", "logprob": float("-inf")}]
    assert token_logprobs({"logprobs": {"content": entries}}) == {
        "tokens": ["Hi", "!"],
        "logprobs": [-0.5, None],  # JSON has no -inf
        "token_ids": [],
    }
    vllm_ids = {"logprobs": {"content": entries}, "token_ids": [9906, 0]}  # return_token_ids
    assert token_logprobs(vllm_ids)["token_ids"] == [9906, 0]
    spelled = [{"token": "token_id:9906", "logprob": -0.1}, {"token": "token_id:0", "logprob": 0}]
    assert token_logprobs({"logprobs": {"content": spelled}})["token_ids"] == [9906, 0]  # --return-tokens-as-token-ids
    assert token_logprobs({"logprobs": None}) is None
    assert token_logprobs({"logprobs": {"content": []}}) is None
    assert token_logprobs({}) is None


def test_logprobs_are_asked_for_and_stored_with_each_assistant_turn(tmp_path):
    script = {
        "p": [
            sh("echo hi") | {"logprobs": [["<call>", -1.25]]},  # a tool call with logprobs of its own
            answer("Done.") | {"logprobs": True, "token_ids": True},
        ],
        "q": [answer("plain")],  # a server may send none for a turn
    }
    data = write_dataset(tmp_path / "ds.jsonl", ["p", "q"])
    with ScriptedServer(script=script) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", "--logprobs"), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    assert bodies and all(b.get("logprobs") is True for b in bodies)
    lines = {r["conversations"][0]["value"]: r for r in RunDir(tmp_path / "out" / "v").trajectories()}
    call, final = gpt_turns(lines["p"])
    assert call["logprobs"] == {"tokens": ["<call>"], "logprobs": [-1.25], "token_ids": []}
    assert call["tool_calls"][0]["name"] == "terminal"
    assert final["logprobs"]["tokens"] == list("Done.")
    assert final["logprobs"]["logprobs"] == [round(-0.01 * i, 4) for i in range(5)]
    assert final["logprobs"]["token_ids"] == [1000, 1001, 1002, 1003, 1004]
    assert "logprobs" not in gpt_turns(lines["q"])[0]
    # Never sent back to the endpoint: the second call's assistant turn carries content and tool calls only.
    second = next(b for b in bodies if any(m["role"] == "assistant" for m in b["messages"]))
    assert all("logprobs" not in m for m in second["messages"])


def test_without_the_flag_logprobs_are_neither_asked_nor_stored(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ["p"])
    with ScriptedServer(script={"p": [answer("Done.") | {"logprobs": True}]}) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v"), tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(done)
    assert bodies and all("logprobs" not in b for b in bodies)
    (line,) = RunDir(tmp_path / "out" / "v").trajectories()
    assert all("logprobs" not in t for t in line["conversations"])


def test_the_local_adapter_asks_llama_cpp_for_logprobs_the_way_it_understands():
    body = local_server.adapt_request({"messages": [{"role": "user", "content": "hi"}], "logprobs": True})
    assert body["top_logprobs"] == 0  # llama-cpp-python returns none without a count
    kept = local_server.adapt_request({"messages": [], "logprobs": True, "top_logprobs": 3})
    assert kept["top_logprobs"] == 3
    assert "top_logprobs" not in local_server.adapt_request({"messages": []})


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python[server] is not installed")
@pytest.mark.slow
def test_the_embedded_model_returns_logprobs_that_spell_its_answers(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ["Name the three primary colors.", "What is the capital of France?"])
    args = [
        f"--dataset_file={data}",
        "--batch_size=2",
        "--run_name=lp",
        f"--output_dir={tmp_path / 'out'}",
        "--model=local",
        "--require_reasoning=false",
        "--max_turns=2",
        "--num_workers=1",
        "--logprobs",
    ]
    done = run_cli(args, tmp_path, timeout=900)
    assert done.returncode in (0, 3), done.stderr[-2000:]
    answers = [
        t for r in RunDir(tmp_path / "out" / "lp").trajectories() for t in gpt_turns(r) if not t.get("tool_calls")
    ]
    assert answers, "the model answered nothing"
    for turn in answers:  # llama.cpp sends logprobs with every text reply (none with a tool call)
        lp = turn["logprobs"]
        assert len(lp["tokens"]) == len(lp["logprobs"]) > 0 and lp["token_ids"] == []
        assert "".join(lp["tokens"]).strip() == turn["value"].strip()
        assert all(isinstance(v, float) and v <= 0 and math.isfinite(v) for v in lp["logprobs"])
    json.dumps(answers, allow_nan=False)  # storable as plain JSON
