"""vision_analyze, image_generate and mixture_of_agents against the scripted OpenAI-compatible server."""

from __future__ import annotations

import base64
import json
import os
import time

import httpx
import pytest
from helpers import make_ctx
from scripted_server import PNG_BYTES, ScriptedServer

from agentbatch.tools import url_policy
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings, from_environment

TOOLS = load_tools()

QUESTION = "What colour is the pixel?"
USAGE = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("IMAGE_API_KEY", "IMAGE_RESPONSE_FORMAT", "IMAGE_SIZE", "VISION_MAX_IMAGE_BYTES", url_policy.ENV_VAR):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def ctxs():
    made = []

    def make(base_url="http://127.0.0.1:9/v1", model="main-model", api_key="test-key", **settings) -> ToolContext:
        """Tool settings from these flags and the (monkeypatched) environment, as a run builds them at start."""
        tools = from_environment(os.environ, **settings)
        made.append(make_ctx(tools, base_url=base_url, model=model, api_key=api_key, max_retries=1))
        return made[-1]

    yield make
    for ctx in made:
        ctx.close()


def run(tool, args: dict, ctx: ToolContext) -> tuple[dict, bool]:
    text, ok = call_tool(tool, json.dumps(args), ctx)
    return json.loads(text), ok


def image_part(request: dict) -> dict:
    [message] = request["messages"]
    text, image = message["content"]
    assert text == {"type": "text", "text": QUESTION}
    assert image["type"] == "image_url"
    return image["image_url"]


# ---------------------------------------------------------------- vision_analyze


def test_vision_sends_url_image_part(ctxs):
    with ScriptedServer(script={QUESTION: {"content": "It is red.", "usage": USAGE}}) as srv:
        ctx = ctxs(base_url=srv.base_url, model="main-model", vision_model="eye-model", allow_private_urls=True)
        image_url = f"http://127.0.0.1:{srv.port}/images/7.png"
        result, ok = run(TOOLS["vision_analyze"], {"image_url": image_url, "question": QUESTION}, ctx)
        [request] = srv.requests()
    assert ok and result == {"analysis": "It is red.", "error": None}
    assert request["model"] == "eye-model"
    assert image_part(request) == {"url": image_url}
    assert (ctx.usage.prompt_tokens, ctx.usage.completion_tokens, ctx.usage.total_tokens) == (7, 3, 10)


def test_vision_sends_sandbox_file_as_data_url(ctxs):
    with ScriptedServer(script={QUESTION: {"content": "Red."}}) as srv:
        ctx = ctxs(base_url=srv.base_url, model="main-model")
        ctx.sandbox().write_file("shots/pixel.png", PNG_BYTES)
        result, ok = run(TOOLS["vision_analyze"], {"image_url": "shots/pixel.png", "question": QUESTION}, ctx)
        [request] = srv.requests()
    assert ok and result["analysis"] == "Red."
    assert request["model"] == "main-model"  # no vision model: the main one
    url = image_part(request)["url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix) and base64.b64decode(url[len(prefix) :]) == PNG_BYTES
    assert ctx.usage.total_tokens == 15


def test_vision_refuses_bad_images_without_calling_the_model(ctxs, monkeypatch):
    monkeypatch.setenv("VISION_MAX_IMAGE_BYTES", "1000")  # read when the run starts, as the other settings
    with ScriptedServer() as srv:
        ctx = ctxs(base_url=srv.base_url, model="m")
        ctx.sandbox().write_file("notes.txt", b"not an image")
        ctx.sandbox().write_file("big.png", PNG_BYTES + b"\0" * 2000)
        cases = {
            f"http://127.0.0.1:{srv.port}/images/1.png": "is not a public address (loopback)",
            "http://169.254.169.254/latest/meta-data/": "link-local",
            "notes.txt": "is not a PNG, JPEG, GIF or WebP image",
            "missing.png": "cannot read image file 'missing.png'",
            "big.png": "over the 1000-byte limit",
            "data:text/html;base64,PGgxPg==": "data:image/<type>;base64",
            "ftp://example.org/a.png": "unsupported image URL",
        }
        for image, expected in cases.items():
            result, ok = run(TOOLS["vision_analyze"], {"image_url": image, "question": QUESTION}, ctx)
            assert not ok and expected in result["error"], (image, result)
        assert srv.requests() == []
    assert ctx.usage.total_tokens == 0


def test_vision_reports_model_errors(ctxs):
    with ScriptedServer(
        script={QUESTION: {"fault": "400", "fault_times": -1, "error_message": "no vision here"}}
    ) as srv:
        ctx = ctxs(base_url=srv.base_url, model="text-only")
        data_url = "data:image/png;base64," + base64.b64encode(PNG_BYTES).decode()
        result, ok = run(TOOLS["vision_analyze"], {"image_url": data_url, "question": QUESTION}, ctx)
    assert not ok
    assert result["error"] == "vision model text-only: request rejected: HTTP 400: no vision here"


# ---------------------------------------------------------------- image_generate


def test_image_generate_returns_url(ctxs):
    with ScriptedServer() as srv:
        # base_url points nowhere: the images must go to image_base_url
        ctx = ctxs(base_url="http://127.0.0.1:9/v1", image_model="paint-1", image_base_url=srv.base_url)
        assert TOOLS["image_generate"].unavailable(ctx.settings) is None
        result, ok = run(TOOLS["image_generate"], {"prompt": "a lighthouse at dusk", "size": "512x512"}, ctx)
        assert ok, result
        assert result["path"] is None
        fetched = httpx.get(result["image_url"])
        [request] = srv.image_requests()
    assert fetched.status_code == 200 and fetched.content == PNG_BYTES
    assert request["model"] == "paint-1"
    assert request["prompt"] == "a lighthouse at dusk"
    assert request["size"] == "512x512" and request["n"] == 1
    assert "response_format" not in request


def test_image_generate_saves_b64_into_sandbox(ctxs, monkeypatch):
    monkeypatch.setenv("IMAGE_RESPONSE_FORMAT", "b64_json")
    with ScriptedServer() as srv:
        ctx = ctxs(base_url=srv.base_url, image_model="paint-1")
        first, ok1 = run(TOOLS["image_generate"], {"prompt": "a red square"}, ctx)
        second, ok2 = run(TOOLS["image_generate"], {"prompt": "another red square"}, ctx)
        requests = srv.image_requests()
    assert ok1 and ok2, (first, second)
    assert first["image_url"] is None
    assert first["path"].startswith("images/image_1_") and first["path"].endswith(".png")
    assert second["path"].startswith("images/image_2_")
    assert ctx.sandbox().read_file(first["path"]) == PNG_BYTES
    assert ctx.sandbox().read_file(second["path"]) == PNG_BYTES
    assert [r["response_format"] for r in requests] == ["b64_json", "b64_json"]


def test_image_generate_unavailable_without_model(ctxs):
    ctx = ctxs(base_url="http://127.0.0.1:9/v1")
    assert "--image_model" in TOOLS["image_generate"].unavailable(ctx.settings)
    result, ok = run(TOOLS["image_generate"], {"prompt": "x"}, ctx)
    assert not ok and "--image_model" in result["error"]


# ---------------------------------------------------------------- mixture_of_agents


def test_moa_calls_references_in_parallel_then_aggregates(ctxs):
    prompt = "Is 2^61 - 1 prime?"
    reply = {"content": "<think>checking</think>Yes, it is a Mersenne prime.", "usage": USAGE, "latency": 0.5}
    with ScriptedServer(script={prompt: reply}) as srv:
        ctx = ctxs(base_url=srv.base_url, model="main", moa_models=("ref-a", "ref-b", "ref-c"), moa_aggregator="agg")
        start = time.monotonic()
        result, ok = run(TOOLS["mixture_of_agents"], {"user_prompt": prompt}, ctx)
        elapsed = time.monotonic() - start
        requests = srv.requests()
    assert ok, result
    assert result["response"] == "Yes, it is a Mersenne prime."
    assert result["reference_models"] == ["ref-a", "ref-b", "ref-c"] and result["failed_models"] == {}
    assert sorted(r["model"] for r in requests[:3]) == ["ref-a", "ref-b", "ref-c"]
    for request in requests[:3]:
        assert request["messages"] == [{"role": "user", "content": prompt}]
    aggregate = requests[3]
    assert aggregate["model"] == "agg"
    system, user = aggregate["messages"]
    assert system["role"] == "system" and user == {"role": "user", "content": prompt}
    for i in (1, 2, 3):
        assert f"{i}. Yes, it is a Mersenne prime." in system["content"]
    assert "checking" not in system["content"]
    # Four calls of 0.5 s: the three references overlap, so about 1 s, never the 2 s of a sequential run.
    assert elapsed < 1.7
    assert (ctx.usage.prompt_tokens, ctx.usage.completion_tokens, ctx.usage.total_tokens) == (28, 12, 40)


def test_moa_aggregator_defaults_to_main_model(ctxs):
    with ScriptedServer() as srv:
        ctx = ctxs(base_url=srv.base_url, model="main", moa_models=("ref-a",))
        result, ok = run(TOOLS["mixture_of_agents"], {"user_prompt": "hi"}, ctx)
        models = [r["model"] for r in srv.requests()]
    assert ok and result["response"] == "OK"
    assert models == ["ref-a", "main"]
    assert ctx.usage.total_tokens == 30


def test_moa_fails_when_every_reference_fails(ctxs):
    script = {"q": {"fault": "400", "fault_times": -1, "error_message": "model not found"}}
    with ScriptedServer(script=script) as srv:
        ctx = ctxs(base_url=srv.base_url, model="main", moa_models=("ref-a", "ref-b"))
        result, ok = run(TOOLS["mixture_of_agents"], {"user_prompt": "q"}, ctx)
        models = sorted(r["model"] for r in srv.requests())
    assert not ok
    assert result["error"].startswith("every reference model failed")
    assert set(result["failed_models"]) == {"ref-a", "ref-b"} and "model not found" in result["failed_models"]["ref-a"]
    assert models == ["ref-a", "ref-b"]  # no aggregator call without answers
    assert ctx.usage.total_tokens == 0


def test_moa_unavailable_without_reference_models():
    assert "--moa_models" in TOOLS["mixture_of_agents"].unavailable(ToolSettings())
    assert TOOLS["mixture_of_agents"].unavailable(ToolSettings(moa_models=("a",))) is None
