"""The real agent loop and model client against the scripted server on 127.0.0.1, tools in a real temp dir."""

from __future__ import annotations

import json
import time

import pytest
from helpers import API_KEY, SequencedServer, gpt_turns, make_ctx, run_agent_once, run_prompt_outcome, tool_turns
from scripted_server import ScriptedServer

P = "the prompt"


def call(name: str, call_id: str | None = None, **arguments) -> dict:
    c = {"name": name, "arguments": arguments}
    if call_id:
        c["id"] = call_id
    return c


def test_multi_step_task_writes_runs_and_answers(tmp_path):
    script = [
        {
            "content": "I'll write the script.",
            "tool_calls": [call("write_file", path="sum.sh", content='echo "sum=$((40 + 2))"\n')],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        },
        {
            "tool_calls": [call("terminal", command="bash sum.sh")],
            "usage": {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26},
        },
        {
            "content": "The script printed sum=42.",
            "usage": {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37},
        },
    ]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"], cwd=str(tmp_path))
        requests = srv.requests()

    assert (tmp_path / "sum.sh").read_text() == 'echo "sum=$((40 + 2))"\n'
    conv = record["conversations"]
    assert [t["from"] for t in conv] == ["human", "gpt", "tool", "gpt", "tool", "gpt"]
    assert conv[0] == {"from": "human", "value": P}
    assert conv[1]["value"] == "I'll write the script."
    (write,) = conv[1]["tool_calls"]
    assert write["name"] == "write_file" and isinstance(write["arguments"], str)
    assert json.loads(write["arguments"]) == {"path": "sum.sh", "content": 'echo "sum=$((40 + 2))"\n'}
    assert conv[2]["tool_call_id"] == write["id"] and conv[2]["name"] == "write_file"
    (term,) = conv[3]["tool_calls"]
    assert json.loads(term["arguments"]) == {"command": "bash sum.sh"}
    result = json.loads(conv[4]["value"])
    # "sum=42" is not in the file text: it appears only if bash really ran the script.
    assert result == {"output": "sum=42\n", "exit_code": 0, "error": None}
    assert conv[4]["tool_call_id"] == term["id"] and conv[4]["name"] == "terminal"
    assert conv[5] == {"from": "gpt", "value": "The script printed sum=42."}
    assert record["completed"] is True and record["partial"] is False
    assert record["api_calls"] == 3 and len(requests) == 3
    assert record["usage"] == {
        "prompt_tokens": 60,
        "completion_tokens": 18,
        "total_tokens": 78,
        "cost": 0.0,
        "cached_calls": 0,
    }
    assert record["tool_stats"]["write_file"] == {"count": 1, "success": 1, "failure": 0}
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}
    offered = {t["function"]["name"] for t in json.loads(record["tools"])}
    assert {"terminal", "read_file", "write_file", "patch", "search_files"} == offered
    assert {t["function"]["name"] for t in requests[0]["tools"]} == offered
    # The endpoint saw each tool result under the id of the call it answers.
    sent = [m for m in requests[2]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in sent] == [write["id"], term["id"]]


def test_max_turns_reached_is_incomplete_but_not_partial():
    with ScriptedServer(default_script=[{"tool_calls": [call("terminal", command="echo again")]}]) as srv:
        record = run_agent_once(srv, P, ["terminal"], max_turns=2)
        assert len(srv.requests()) == 2
    assert record["completed"] is False and record["partial"] is False
    assert record["stop_reason"] == "max_turns"
    assert record["api_calls"] == 2
    assert [t["from"] for t in record["conversations"]] == ["human", "gpt", "tool", "gpt", "tool"]


def test_reply_without_tool_calls_completes():
    with ScriptedServer(script={P: [{"content": "Just an answer."}]}) as srv:
        record = run_agent_once(srv, P, ["terminal"])
    assert record["completed"] is True and record["partial"] is False and record["api_calls"] == 1
    assert record["stop_reason"] == "answered" and record["sample_index"] == 0
    assert record["conversations"][1:] == [{"from": "gpt", "value": "Just an answer."}]


def test_three_unknown_tool_replies_in_a_row_end_partial(tmp_path):
    # A known call beside an unknown one does not run either; a toolset's tool that was not offered is unknown too.
    first = {"tool_calls": [call("write_file", path="ran.txt", content="x"), call("no_such_tool")]}
    first["then"] = [{"tool_calls": [call("browser_click", ref="e1")]}, {"tool_calls": [call("made_up")]}]
    with SequencedServer(script={P: [first, {"content": "never reached"}]}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"], cwd=str(tmp_path))
        requests = srv.requests()
    assert record["partial"] is True and record["completed"] is False
    assert record["stop_reason"] == "invalid_tools"
    assert record["api_calls"] == 3 and len(requests) == 3
    assert record["conversations"] == [{"from": "human", "value": P}]
    assert not (tmp_path / "ran.txt").exists()
    # Each re-ask sends the same conversation: the dropped reply was never saved.
    assert all(r["messages"] == requests[0]["messages"] for r in requests)
    assert all(s["count"] == 0 for s in record["tool_stats"].values())


def test_unknown_tool_replies_then_good_ones_continue_normally():
    # Two unknown replies per turn never make three in a row, because each good reply resets the count.
    turn0 = {"tool_calls": [call("bogus")], "then": [{"tool_calls": [call("bogus")]}]}
    turn0["then"].append({"tool_calls": [call("terminal", command="echo fine")]})
    turn1 = {"tool_calls": [call("nope")], "then": [{"tool_calls": [call("nope")]}, {"content": "all done"}]}
    with SequencedServer(script={P: [turn0, turn1]}) as srv:
        record = run_agent_once(srv, P, ["terminal"])
    assert record["completed"] is True and record["partial"] is False
    assert record["api_calls"] == 6
    conv = record["conversations"]
    assert [t["from"] for t in conv] == ["human", "gpt", "tool", "gpt"]
    assert conv[1]["tool_calls"][0]["name"] == "terminal"
    assert json.loads(conv[2]["value"])["output"] == "fine\n"
    assert conv[3]["value"] == "all done"
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}


def test_invalid_arguments_and_raising_tool_come_back_as_errors():
    bad_json = {"name": "terminal", "arguments": '{"command": "echo hi"'}
    # read_file of a missing path raises FileNotFoundError inside the tool.
    script = [{"tool_calls": [bad_json, call("read_file", path="missing.txt")]}, {"content": "recovered"}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"])
        requests = srv.requests()
    conv = record["conversations"]
    assert [t["from"] for t in conv] == ["human", "gpt", "tool", "tool", "gpt"]
    assert conv[1]["tool_calls"][0]["arguments"] == '{"command": "echo hi"'
    assert "invalid JSON arguments" in json.loads(conv[2]["value"])["error"]
    assert "FileNotFoundError" in json.loads(conv[3]["value"])["error"]
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 0, "failure": 1}
    assert record["tool_stats"]["read_file"] == {"count": 1, "success": 0, "failure": 1}
    assert record["tool_error_counts"]["terminal"] == 1 and record["tool_error_counts"]["read_file"] == 1
    assert record["completed"] is True and record["api_calls"] == 2
    errors = [json.loads(m["content"])["error"] for m in requests[1]["messages"] if m["role"] == "tool"]
    assert len(errors) == 2 and all(errors)


def test_length_cut_reply_ends_partial_and_its_calls_never_run(tmp_path):
    script = [
        {"tool_calls": [call("terminal", command="echo ok")]},
        {
            "content": "The answer is",
            "tool_calls": [call("write_file", path="cut.txt", content="x")],
            "finish_reason": "length",
        },
    ]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"], cwd=str(tmp_path))
    assert record["partial"] is True and record["completed"] is False and record["api_calls"] == 2
    assert record["stop_reason"] == "length"
    assert not (tmp_path / "cut.txt").exists()
    last = record["conversations"][-1]
    # A truncated call was never run, so it is neither in the trajectory nor counted as a tool failure.
    assert last == {"from": "gpt", "value": "The answer is"}
    assert record["tool_stats"]["write_file"]["count"] == 0
    assert record["tool_stats"]["terminal"] == {"count": 1, "success": 1, "failure": 0}


def test_context_overflow_ends_partial():
    script = [{"tool_calls": [call("terminal", command="echo big")]}, {"fault": "context_length", "fault_times": -1}]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal"])
        assert len(srv.requests()) == 2  # a context overflow is not retried
    assert record["partial"] is True and record["completed"] is False and record["api_calls"] == 2
    assert record["stop_reason"] == "context"
    assert [t["from"] for t in record["conversations"]] == ["human", "gpt", "tool"]


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (
            {
                "providers_allowed": ("anthropic", "google"),
                "providers_ignored": ("deepinfra",),
                "providers_order": ("google", "anthropic"),
                "provider_sort": "price",
            },
            {
                "provider": {
                    "only": ["anthropic", "google"],
                    "ignore": ["deepinfra"],
                    "order": ["google", "anthropic"],
                    "sort": "price",
                }
            },
        ),
        ({"reasoning_disabled": True}, {"reasoning": {"effort": "none"}}),
        ({"reasoning_effort": "high"}, {"reasoning": {"enabled": True, "effort": "high"}}),
        (
            {"providers_order": ("a",), "reasoning_effort": "low"},
            {"provider": {"order": ["a"]}, "reasoning": {"enabled": True, "effort": "low"}},
        ),
        ({}, {}),
    ],
    ids=["providers", "reasoning-disabled", "reasoning-effort", "both", "none"],
)
def test_openrouter_extras_in_request_body(cfg, expected):
    script = [{"tool_calls": [call("terminal", command="true")]}, {"content": "done"}]
    with ScriptedServer(script={P: script}) as srv:
        run_agent_once(srv, P, ["terminal"], **cfg)
        requests = srv.requests()
    assert len(requests) == 2
    for body in requests:
        assert {k: body[k] for k in ("provider", "reasoning") if k in body} == expected


def test_ephemeral_system_prompt_and_prefill_are_sent_but_never_saved():
    prefill = [{"role": "user", "content": "PREFILL-QUESTION"}, {"role": "assistant", "content": "PREFILL-ANSWER"}]
    # The scripted server keys replies on the first user message and counts every assistant message.
    script = [{}, {"tool_calls": [call("terminal", command="echo step")]}, {"content": "final"}]
    with ScriptedServer(script={"PREFILL-QUESTION": script}) as srv:
        record = run_agent_once(srv, P, ["terminal"], system_prompt="EPHEMERAL-SYSTEM", prefill=prefill)
        requests = srv.requests()
    assert len(requests) == 2
    for body in requests:
        assert body["messages"][:4] == [
            {"role": "system", "content": "EPHEMERAL-SYSTEM"},
            *prefill,
            {"role": "user", "content": P},
        ]
    saved = json.dumps(record)
    assert "EPHEMERAL-SYSTEM" not in saved and "PREFILL" not in saved
    assert record["conversations"][0] == {"from": "human", "value": P}
    assert record["completed"] is True


REASONING_SOURCES = {
    "reasoning": ({"reasoning": "because R"}, "Answer"),
    "reasoning_content": ({"reasoning_content": "because R"}, "Answer"),
    "details-text": ({"reasoning_details": [{"type": "reasoning.text", "text": "because R"}]}, "Answer"),
    "details-summary": ({"reasoning_details": [{"type": "reasoning.summary", "summary": "because R"}]}, "Answer"),
    "think-block": ({}, "<think>because R</think>\nAnswer"),
    "scratchpad-block": ({}, "<REASONING_SCRATCHPAD>\nbecause R\n</REASONING_SCRATCHPAD>Answer"),
}


@pytest.mark.parametrize("source", list(REASONING_SOURCES))
def test_reasoning_from_each_source_leads_the_gpt_value(source):
    fields, content = REASONING_SOURCES[source]
    script = [
        {**fields, "content": content, "tool_calls": [call("terminal", command="true")]},
        {**fields, "content": content},
    ]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal"])
    values = [t["value"] for t in gpt_turns(record)]
    assert values == ["<think>\nbecause R\n</think>\nAnswer"] * 2


@pytest.mark.parametrize(
    "fault",
    [
        {"fault": "500"},
        {"fault": "503"},
        {"fault": "408"},
        {"fault": "409"},
        {"fault": "drop"},
        {"fault": "malformed"},
        {"fault": "slow", "slow_seconds": 3},
    ],
    ids=["500", "503", "408", "409", "drop", "malformed", "slow"],
)
def test_transient_fault_is_retried_then_succeeds(fault):
    with ScriptedServer(script={P: [{**fault, "content": "after the fault"}]}) as srv:
        start = time.monotonic()
        record = run_agent_once(srv, P, [], request_timeout=0.5, max_retries=2)
        elapsed = time.monotonic() - start
        assert len(srv.requests()) == 2
    assert record["completed"] is True and record["api_calls"] == 1
    assert record["conversations"][-1]["value"] == "after the fault"
    assert elapsed < 2.5  # the slow reply was abandoned at the request timeout, not waited for


@pytest.mark.parametrize("status", ["401", "403", "404", "422"])
def test_client_errors_fail_at_once_with_the_servers_message(status):
    spec = {"fault": status, "fault_times": -1, "error_message": f"denied with {status}"}
    with ScriptedServer(script={P: [spec]}) as srv:
        outcome = run_prompt_outcome(srv, P, [], max_retries=3)
        assert len(srv.requests()) == 1, "a client error is not retried"
    assert outcome.status == "failed" and outcome.error == f"HTTP {status}: denied with {status}"
    assert API_KEY not in outcome.error


def test_rate_limit_honours_retry_after():
    with ScriptedServer(script={P: [{"fault": "429", "retry_after": "1", "content": "finally"}]}) as srv:
        start = time.monotonic()
        record = run_agent_once(srv, P, [], retry_base_delay=0.01)
        elapsed = time.monotonic() - start
        assert len(srv.requests()) == 2
    assert elapsed >= 1.0
    assert record["completed"] is True and record["conversations"][-1]["value"] == "finally"


def test_rate_limit_honours_retry_after_given_as_an_http_date():
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    # Whole seconds in the header: aim 2.5 s ahead so the wait is at least ~1.5 s, far above the 0.01 s backoff.
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=2.5), usegmt=True)
    with ScriptedServer(script={P: [{"fault": "429", "retry_after": when, "content": "later"}]}) as srv:
        start = time.monotonic()
        record = run_agent_once(srv, P, [], retry_base_delay=0.01)
        elapsed = time.monotonic() - start
    assert elapsed >= 1.4
    assert record["conversations"][-1]["value"] == "later"


def test_persistent_error_raises_after_max_retries_and_fails_the_prompt():
    with ScriptedServer(script={P: [{"fault": "500", "fault_times": -1}]}) as srv:
        outcome = run_prompt_outcome(srv, P, ["terminal"], max_retries=2, prompt_index=7)
        assert len(srv.requests()) == 3
    assert outcome.status == "failed" and outcome.record is None
    assert "500" in outcome.error and API_KEY not in outcome.error


def test_tool_stats_follow_call_ids_through_the_loop():
    # Two calls in one reply, one failing; then a provider that reuses call ids across turns.
    script = [
        {"tool_calls": [call("read_file", "c1", path="missing.txt"), call("terminal", "c2", command="echo ok")]},
        {"tool_calls": [call("read_file", "same", path="missing.txt")]},
        {"tool_calls": [call("terminal", "same", command="echo ok")]},
        {"content": "done"},
    ]
    with ScriptedServer(script={P: script}) as srv:
        record = run_agent_once(srv, P, ["terminal", "file"])
    assert [t["tool_call_id"] for t in tool_turns(record)] == ["c1", "c2", "same", "same"]
    assert record["tool_stats"]["read_file"] == {"count": 2, "success": 0, "failure": 2}
    assert record["tool_stats"]["terminal"] == {"count": 2, "success": 2, "failure": 0}
    assert record["tool_error_counts"]["read_file"] == 2 and record["tool_error_counts"]["terminal"] == 0
    assert record["completed"] and not record["partial"]


def test_calls_without_ids_or_with_object_arguments_are_normalised(tmp_path):
    # The scripted server always sends ids and string arguments; some real servers do neither, so a
    # stand-in client returns such a reply (the only case here that cannot go through the server).
    from agentbatch.agent_loop import run_agent
    from agentbatch.model.base import Reply
    from agentbatch.sandboxes.base import SandboxSpec
    from agentbatch.tools.registry import load_tools

    replies = [
        {
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "content": "",
                        "tool_calls": [
                            {"type": "function", "function": {"name": "terminal", "arguments": {"command": "echo hi"}}}
                        ],
                    },
                }
            ]
        },
        {"choices": [{"finish_reason": "stop", "message": {"content": "done"}}]},
    ]

    class StandIn:
        def chat(self, messages, tools=None, model=None, deadline=None):
            return Reply(replies[sum(m["role"] == "assistant" for m in messages)])

    ctx = make_ctx(spec=SandboxSpec(cwd=str(tmp_path)))
    try:
        result = run_agent("p", StandIn(), [load_tools()["terminal"]], ctx, max_turns=3)
    finally:
        ctx.close()
    call = result.messages[1]["tool_calls"][0]
    assert call["id"] and call["function"]["arguments"] == '{"command": "echo hi"}'
    assert result.messages[2]["tool_call_id"] == call["id"]
    assert json.loads(result.messages[2]["content"])["output"] == "hi\n"
    assert result.completed
