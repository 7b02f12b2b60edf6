"""Reliability: what an endpoint or a web service sends cannot hang a call, crash a prompt or spoil the data.

Odd but valid JSON, runaway replies, lone surrogates and servers that trickle a byte a second, each
through the real CLI against a scripted endpoint on 127.0.0.1 (issue 18, items 2, 8, 9 and 11).
"""

from __future__ import annotations

import json
import time

import datasets
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, thinking, write_dataset
from fake_site import FakeSite, json_reply, trickle_reply
from helpers import SequencedServer

from agentbatch.model.client import MAX_REPLY_BYTES, MAX_TOOL_CALLS

DEEP = 100_000
GOOD = thinking("recovered")


def completion(message: dict, usage=None, finish: str = "stop") -> str:
    """A chat completion body as raw JSON text, so a test can send shapes the scripted server would not build."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10} if usage is None else usage
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}
    return json.dumps({"id": "odd", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage})


def tool_call(call_id, name="terminal", arguments='{"command": "echo ran"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def deep_object_arguments() -> str:
    """A tool call whose arguments are an object nested 100,000 deep (json.dumps could not even build it)."""
    body = completion({"content": None, "tool_calls": [tool_call("c1", arguments={"x": "PLACEHOLDER"})]})
    return body.replace('"PLACEHOLDER"', "[" * DEEP + "]" * DEEP)


# Each is the first reply to its prompt; the endpoint answers GOOD when asked again.
ODD_REPLIES = {
    "a list as a tool call id": completion({"content": None, "tool_calls": [tool_call([1, 2])]}, finish="tool_calls"),
    "arguments nested 100,000 deep": deep_object_arguments(),
    "choices is a string": json.dumps({"choices": "x"}),
    "message is null": json.dumps({"choices": [{"index": 0, "message": None}]}),
    "tool_calls is an object": completion({"content": None, "tool_calls": {"id": "c1"}}),
    "function is a string": completion({"content": None, "tool_calls": [{"id": "c1", "function": "terminal"}]}),
    "a number as the tool name": completion({"content": None, "tool_calls": [tool_call("c1", name=5)]}),
    "content is a number": completion({"content": 42}),
    "too many tool calls": completion(
        {"content": None, "tool_calls": [tool_call(f"c{i}") for i in range(MAX_TOOL_CALLS + 1)]}, finish="tool_calls"
    ),
    "a runaway reply": completion({"content": "x" * (MAX_REPLY_BYTES + 1024)}),
}


def args_for(data, out, srv, *extra) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=50",
        "--run_name=odd",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=odd-replies-key",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--num_workers=1",
        "--concurrency=4",
        "--max_retries=2",
        *extra,
    ]


def test_odd_but_valid_json_replies_are_retried_as_malformed_never_an_internal_error(tmp_path):
    script = {prompt: [{"raw": raw, "then": [GOOD]}] for prompt, raw in ODD_REPLIES.items()}
    # Usage counts as strings are read as numbers; an odd id that is harmless (a number) is normalised.
    script["usage counts as strings"] = [
        {"raw": completion({"content": "ok"}, usage={"prompt_tokens": "12", "completion_tokens": "3"})}
    ]
    script["a number as a tool call id"] = [
        {"raw": completion({"content": None, "tool_calls": [tool_call(7)]}, finish="tool_calls")},
        GOOD,
    ]
    # Arguments as a JSON string nested 100,000 deep are the model's mistake: a tool error it is shown.
    script["a string of arguments nested 100,000 deep"] = [
        {"raw": completion({"content": None, "tool_calls": [tool_call("c1", arguments="[" * DEEP)]})},
        GOOD,
    ]
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with SequencedServer(script=script) as srv:
        proc = run_cli(args_for(data, tmp_path / "out", srv), tmp_path)
        asked = srv.requests()
    assert_clean_exit(proc)
    run = RunDir(tmp_path / "out" / "odd")
    assert not run.failed(), run.failed()
    records = {prompt_of_record(r): r for r in run.trajectories()}
    assert sorted(records) == sorted(script)
    for prompt in ODD_REPLIES:  # asked again, and only the good reply was kept
        assert records[prompt]["conversations"][-1]["value"].endswith("recovered"), prompt
        assert sum(1 for b in asked if b["messages"][0]["content"] == prompt) == 2, prompt
    assert records["usage counts as strings"]["usage"]["prompt_tokens"] == 12
    number_id = records["a number as a tool call id"]["conversations"]
    assert number_id[1]["tool_calls"][0]["id"] == "7" and number_id[2]["tool_call_id"] == "7"
    [deep] = [t for t in records["a string of arguments nested 100,000 deep"]["conversations"] if t["from"] == "tool"]
    assert "nested too deeply" in json.loads(deep["value"])["error"]
    # Every line has one shape: the file loads whole.
    loaded = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert len(loaded) == len(script)


def test_odd_replies_that_never_get_better_fail_only_their_prompt_with_the_reason(tmp_path):
    script = {
        "always a list id": [{"raw": ODD_REPLIES["a list as a tool call id"]}],
        "always too big": [{"raw": ODD_REPLIES["a runaway reply"]}],
        "healthy": [GOOD],
    }
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with SequencedServer(script=script) as srv:
        proc = run_cli(args_for(data, tmp_path / "out", srv, "--max_retries=1"), tmp_path)
    assert_clean_exit(proc, 3)
    run = RunDir(tmp_path / "out" / "odd")
    errors = {f["prompt"]: f["error"] for f in run.failed()}
    assert errors.keys() == {"always a list id", "always too big"}
    assert errors["always a list id"] == "malformed reply: a tool call id is a list (after 2 attempts)"
    assert f"over the {MAX_REPLY_BYTES}-byte reply limit" in errors["always too big"]
    assert not any("internal error" in e for e in errors.values())
    assert [prompt_of_record(r) for r in run.trajectories()] == ["healthy"]


def test_a_trickling_endpoint_is_cut_at_request_timeout_not_per_byte(tmp_path):
    """One byte every 0.5 s of a ~300-byte reply would take minutes; --request_timeout=2 ends each attempt at 2 s."""
    script = {"trickled": [{"content": "slowly " * 20, "trickle_seconds": 0.5}], "quick": [GOOD]}
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with SequencedServer(script=script) as srv:
        started = time.monotonic()
        proc = run_cli(args_for(data, tmp_path / "out", srv, "--request_timeout=2", "--max_retries=1"), tmp_path)
        took = time.monotonic() - started
    assert_clean_exit(proc, 3)
    run = RunDir(tmp_path / "out" / "odd")
    [failed] = run.failed()
    assert failed["prompt"] == "trickled" and failed["error"] == "request timed out (after 2 attempts)"
    # The trickle alone lasts over 150 s an attempt; generous for a loaded machine, far below that.
    assert took < 100, took


def test_a_trickling_web_page_and_search_service_are_cut_at_the_web_timeout(tmp_path):
    page = FakeSite({"/slow": trickle_reply(b"<html><body><p>" + b"x" * 400 + b"</p></body></html>", 0.5)})
    search = FakeSite({"/search": trickle_reply(json.dumps({"results": []}).encode() + b" " * 300, 0.5)})
    search.routes["/fast"] = lambda seen: json_reply({"results": []})
    script = {
        "read a slow page": [
            {"tool_calls": [{"name": "web_extract", "arguments": {"urls": [f"{page.url}/slow"]}}]},
            {"tool_calls": [{"name": "web_search", "arguments": {"query": "anything"}}]},
            GOOD,
        ]
    }
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    env = {"WEB_TIMEOUT": "2", "TAVILY_API_KEY": "tvly-reliability-test", "TAVILY_BASE_URL": search.url}
    try:
        with SequencedServer(script=script) as srv:
            args = args_for(data, tmp_path / "out", srv, "--distribution=minimal", "--allow_private_urls=true")
            started = time.monotonic()
            proc = run_cli(args, tmp_path, env=env)
            took = time.monotonic() - started
    finally:
        page.close()
        search.close()
    assert_clean_exit(proc)
    [record] = RunDir(tmp_path / "out" / "odd").trajectories()
    extract, searched = (json.loads(t["value"]) for t in record["conversations"] if t["from"] == "tool")
    assert "Timeout" in extract["results"][0]["error"], extract
    assert "tavily search failed" in searched["error"] and "Timeout" in searched["error"], searched
    # Page and search each trickle for over 150 s; three search attempts of 2 s and their pauses take ~9 s.
    assert took < 100, took


def test_a_lone_surrogate_in_a_reply_leaves_every_file_loadable(tmp_path):
    # json.dumps writes each lone surrogate as the JSON escape "\\ud800", as an endpoint would send it.
    reply = completion(
        {
            "content": "content \ud800 and \udfff",
            "reasoning": "reasoning \ud800 and \udfff",
            "tool_calls": [tool_call("c1", arguments='{"command": "echo argument \ud800 and \udfff"}')],
        },
        finish="tool_calls",
    )
    assert "\\ud800" in reply
    script = {"surrogates": [{"raw": reply}, thinking("done")]}
    data = write_dataset(tmp_path / "ds.jsonl", [*script, "plain"])
    with SequencedServer(script=script, default_script=[GOOD]) as srv:
        proc = run_cli(args_for(data, tmp_path / "out", srv, "--require_reasoning=true"), tmp_path)
    assert_clean_exit(proc)
    run = RunDir(tmp_path / "out" / "odd")
    for name in ("trajectories.jsonl", "batch_0.jsonl"):
        raw = (run.path / name).read_bytes().lower()
        assert b"\\ud8" not in raw and b"\\udf" not in raw, name
    loaded = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert len(loaded) == 2
    record = next(r for r in run.trajectories() if prompt_of_record(r) == "surrogates")
    gpt = record["conversations"][1]
    assert "content \ufffd and \ufffd" in gpt["value"] and "reasoning \ufffd and \ufffd" in gpt["value"]
    assert "argument \ufffd and \ufffd" in gpt["tool_calls"][0]["arguments"]
