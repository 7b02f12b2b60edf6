"""Tests for scripted_server.ScriptedServer, driven through the real openai client."""

from __future__ import annotations

import base64
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from scripted_server import PNG_BYTES, ScriptedServer

ROOT = Path(__file__).resolve().parents[1]


def client_for(srv_or_url, **kw) -> openai.OpenAI:
    """OpenAI client without retries, so every injected fault is visible."""
    url = srv_or_url if isinstance(srv_or_url, str) else srv_or_url.base_url
    return openai.OpenAI(base_url=url, api_key="test", max_retries=0, timeout=kw.pop("timeout", 20), **kw)


def ask(client, prompt, history=(), model="test-model"):
    """Send one chat request whose first user message is `prompt`."""
    messages = [{"role": "user", "content": prompt}, *history]
    return client.chat.completions.create(model=model, messages=messages)


def http(url, data=None, method=None):
    """Plain urllib request returning (status, headers, body bytes), errors included."""
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


def test_tool_call_reply_parses():
    script = {"weather?": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}]}
    with ScriptedServer(script=script) as srv:
        resp = ask(client_for(srv), "weather?", model="my-model")
    assert resp.object == "chat.completion"
    assert resp.model == "my-model"
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id == "call_0_0"
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert resp.usage.total_tokens == 15


def test_reply_index_follows_assistant_count_and_repeats_last():
    script = {
        "p": [
            {"content": "first"},
            {"content": "second"},
            {"content": "last", "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}},
        ]
    }
    with ScriptedServer(script=script) as srv:
        c = client_for(srv)
        assistant = {"role": "assistant", "content": "x"}
        tool = {"role": "tool", "tool_call_id": "call_0_0", "content": "r"}
        assert ask(c, "p").choices[0].message.content == "first"
        # Tool and user messages do not advance the script; only assistant turns do.
        assert ask(c, "p", [assistant, tool]).choices[0].message.content == "second"
        resp = ask(c, "p", [assistant, tool, assistant, {"role": "user", "content": "more"}])
        assert resp.choices[0].message.content == "last"
        assert resp.usage.total_tokens == 3
        assert ask(c, "p", [assistant] * 7).choices[0].message.content == "last"
        assert len(srv.requests()) == 4
        assert srv.requests()[1]["messages"][1] == assistant


def test_list_content_parts_are_joined_for_lookup():
    with ScriptedServer(script={"a\nb": [{"content": "joined"}]}) as srv:
        parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
        resp = ask(client_for(srv), parts)
    assert resp.choices[0].message.content == "joined"


def test_fault_times_two_gives_two_errors_then_success():
    script = {"flaky": [{"content": "finally", "fault": "500", "fault_times": 2}]}
    with ScriptedServer(script=script) as srv:
        c = client_for(srv)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError) as err:
                ask(c, "flaky")
            assert err.value.status_code == 500
            assert err.value.body["type"] == "server_error"
        assert ask(c, "flaky").choices[0].message.content == "finally"
        assert ask(c, "flaky").choices[0].message.content == "finally"


def test_fault_counter_is_per_reply_index():
    script = {"p": [{"content": "a", "fault": "500"}, {"content": "b", "fault": "500", "fault_times": -1}]}
    with ScriptedServer(script=script) as srv:
        c = client_for(srv)
        with pytest.raises(openai.InternalServerError):
            ask(c, "p")
        assert ask(c, "p").choices[0].message.content == "a"
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                ask(c, "p", [{"role": "assistant", "content": "a"}])


def test_429_carries_retry_after():
    srv = ScriptedServer(script={"p": [{"fault": "429", "retry_after": "7"}]})
    with srv, pytest.raises(openai.RateLimitError) as err:
        ask(client_for(srv), "p")
    assert err.value.status_code == 429
    assert err.value.response.headers["retry-after"] == "7"
    assert err.value.code == "rate_limit_exceeded"


def test_400_and_context_length_errors():
    script = {"bad": [{"fault": "400"}], "long": [{"fault": "context_length"}]}
    with ScriptedServer(script=script) as srv:
        c = client_for(srv)
        with pytest.raises(openai.BadRequestError) as bad:
            ask(c, "bad")
        assert bad.value.body["type"] == "invalid_request_error"
        with pytest.raises(openai.BadRequestError) as long:
            ask(c, "long")
    assert long.value.code == "context_length_exceeded"
    assert "maximum context length is" in long.value.message


def test_drop_raises_connection_error_then_recovers():
    with ScriptedServer(script={"p": [{"content": "back", "fault": "drop"}]}) as srv:
        c = client_for(srv)
        with pytest.raises(openai.APIConnectionError):
            ask(c, "p")
        assert ask(c, "p").choices[0].message.content == "back"


def test_malformed_body_raises():
    with ScriptedServer(script={"p": [{"fault": "malformed"}]}) as srv:
        c = client_for(srv)
        # The client surfaces undecodable JSON as a ValueError, not an APIError.
        with pytest.raises((ValueError, openai.APIError)):
            ask(c, "p")
        assert ask(c, "p").choices[0].message.content == "OK"


def test_slow_fault_delays_then_answers():
    script = {
        "p": [{"content": "late", "fault": "slow", "slow_seconds": 0.5}],
        "stuck": [{"fault": "slow", "slow_seconds": 5, "fault_times": -1}],
    }
    with ScriptedServer(script=script) as srv:
        start = time.monotonic()
        assert ask(client_for(srv), "p").choices[0].message.content == "late"
        assert time.monotonic() - start >= 0.45
        with pytest.raises(openai.APITimeoutError):
            ask(client_for(srv, timeout=0.3), "stuck")


def test_default_script_substitution_and_plain_default():
    default = [{"content": "echo: {prompt}"}, {"content": "done with {prompt}", "finish_reason": "length"}]
    with ScriptedServer(script={"known": [{"content": "scripted"}]}, default_script=default) as srv:
        c = client_for(srv)
        assert ask(c, "known").choices[0].message.content == "scripted"
        assert ask(c, "what is 2+2").choices[0].message.content == "echo: what is 2+2"
        resp = ask(c, "hm", [{"role": "assistant", "content": "x"}])
        assert resp.choices[0].message.content == "done with hm"
        assert resp.choices[0].finish_reason == "length"
    with ScriptedServer() as srv:
        resp = ask(client_for(srv), "anything")
    assert resp.choices[0].message.content == "OK"
    assert resp.choices[0].finish_reason == "stop"


def test_reasoning_fields_are_reachable():
    details = [{"type": "reasoning.text", "text": "step 1"}]
    spec = {"content": "42", "reasoning": "think", "reasoning_content": "think more", "reasoning_details": details}
    with ScriptedServer(script={"q": [spec]}) as srv:
        msg = ask(client_for(srv), "q").choices[0].message
    extra = msg.model_extra or {}
    assert extra["reasoning"] == "think"
    assert extra["reasoning_content"] == "think more"
    assert extra["reasoning_details"] == details
    assert msg.reasoning_content == "think more"


def test_concurrent_requests_overlap():
    with ScriptedServer(latency=0.5) as srv:
        c = client_for(srv)
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=50) as pool:
            results = list(pool.map(lambda i: ask(c, f"p{i}"), range(50)))
        elapsed = time.monotonic() - start
        assert len(srv.requests()) == 50
    assert all(r.choices[0].message.content == "OK" for r in results)
    assert 0.45 <= elapsed < 5.0


def test_latency_distributions_keep_the_mean():
    srv = ScriptedServer(latency=2.0, jitter=0.25, seed=3)
    try:
        draws = [srv.draw_latency() for _ in range(5000)]
        assert min(draws) >= 1.5 and max(draws) <= 2.5
        srv.heavy_tail = True
        draws = [srv.draw_latency() for _ in range(40000)]
        assert statistics.fmean(draws) == pytest.approx(2.0, rel=0.06)
        assert statistics.median(draws) < 1.5  # the tail, not the bulk, carries the mean
        assert max(draws) > 10.0
    finally:
        srv.stop()


def test_global_fault_rates_and_runtime_change():
    with ScriptedServer(fault_rates={"429": 1.0}) as srv:
        c = client_for(srv)
        with pytest.raises(openai.RateLimitError):
            ask(c, "x")
        srv.set_fault_rates({"500": 1.0})
        with pytest.raises(openai.InternalServerError):
            ask(c, "x")
        status, _, body = http(srv.base_url.replace("/v1", "/_faults"), json.dumps({}).encode())
        assert status == 200 and json.loads(body) == {}
        assert ask(c, "x").choices[0].message.content == "OK"
        with pytest.raises(ValueError):
            srv.set_fault_rates({"500": 0.8, "429": 0.8})


def test_global_fault_mix_is_seeded_and_roughly_right():
    def outcomes(seed):
        with ScriptedServer(fault_rates={"500": 0.3, "drop": 0.2}, seed=seed) as srv:
            c = client_for(srv)
            seen = []
            for i in range(200):
                try:
                    ask(c, f"p{i}")
                    seen.append("ok")
                except openai.InternalServerError:
                    seen.append("500")
                except openai.APIConnectionError:
                    seen.append("drop")
            return seen

    first = outcomes(7)
    assert first == outcomes(7)
    assert 30 <= first.count("500") <= 90 and 15 <= first.count("drop") <= 65


def test_models_and_images_endpoints():
    with ScriptedServer() as srv:
        c = client_for(srv)
        assert [m.id for m in c.models.list().data] == ["scripted-model"]
        url = c.images.generate(model="img", prompt="a cat").data[0].url
        assert url.startswith(f"http://127.0.0.1:{srv.port}/images/") and url.endswith(".png")
        status, headers, body = http(url)
        assert status == 200 and headers["Content-Type"] == "image/png" and body == PNG_BYTES
        b64 = c.images.generate(model="img", prompt="a dog", response_format="b64_json").data[0].b64_json
        assert base64.b64decode(b64) == PNG_BYTES
        assert [r["prompt"] for r in srv.image_requests()] == ["a cat", "a dog"]
        assert srv.requests() == []
    assert PNG_BYTES.startswith(b"\x89PNG\r\n\x1a\n") and PNG_BYTES.endswith(b"IEND\xaeB`\x82")


def test_bad_requests_do_not_kill_the_server():
    with ScriptedServer(script={"p": [{"fault": "no-such-fault"}]}) as srv:
        chat = srv.base_url + "/chat/completions"
        status, _, body = http(chat, b"{not json")
        assert status == 400 and "not valid JSON" in json.loads(body)["error"]["message"]
        status, _, _ = http(chat, b"[1, 2]")
        assert status == 400
        status, _, body = http(chat, json.dumps({"messages": [{"role": "user", "content": "p"}]}).encode())
        assert status == 500 and "no-such-fault" in json.loads(body)["error"]["message"]
        status, _, _ = http(srv.base_url + "/nowhere")
        assert status == 404
        assert ask(client_for(srv), "fine").choices[0].message.content == "OK"


def test_stop_is_prompt_even_with_sleeping_handlers():
    srv = ScriptedServer(latency=30)
    c = client_for(srv, timeout=60)
    outcome = []

    def call():
        try:
            outcome.append(ask(c, "x"))
        except openai.APIError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not srv.requests() and time.monotonic() < deadline:
        time.sleep(0.01)
    start = time.monotonic()
    srv.stop()
    thread.join(timeout=5)
    assert time.monotonic() - start < 3 and not thread.is_alive()
    assert isinstance(outcome[0], openai.APIConnectionError)


def test_subprocess_mode_prints_ready_and_serves(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"hello": [{"content": "hi from subprocess"}]}))
    default = tmp_path / "default.json"
    default.write_text(json.dumps([{"content": "default {prompt}"}]))
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "scripted_server.py"),
        "--port",
        "0",
        "--script",
        str(script),
        "--default_script",
        str(default),
        "--latency",
        "0.01",
        "--jitter",
        "0.2",
        "--heavy_tail",
        "--fault_rates",
        '{"500": 0.0}',
        "--seed",
        "1",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = []
        reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout=15)
        assert line and line[0].startswith("READY http://127.0.0.1:"), line
        base_url = line[0].split()[1]
        assert base_url.endswith("/v1")
        c = client_for(base_url)
        assert ask(c, "hello").choices[0].message.content == "hi from subprocess"
        assert ask(c, "other").choices[0].message.content == "default other"
        status, _, body = http(base_url.replace("/v1", "/_requests"))
        assert status == 200 and [r["messages"][0]["content"] for r in json.loads(body)] == ["hello", "other"]
        http(base_url.replace("/v1", "/_faults"), json.dumps({"500": 1.0}).encode())
        with pytest.raises(openai.InternalServerError):
            ask(c, "hello")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert proc.stdout.read() == "" and proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
