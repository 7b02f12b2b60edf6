"""Exports read by the tools people use them with: chat templates (as transformers renders them), Inspect's reader
and its viewer in the real Chromium."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import assert_clean_exit, read_jsonl
from export_helpers import batch_records, export_cli, make_run

from agentbatch.model.local_server import default_model_path

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    run_dir = make_run(tmp_path_factory.mktemp("consumers"))
    assert_clean_exit(export_cli(run_dir, "--export=openai,inspect"))
    return run_dir


def gguf_chat_template() -> str:
    """The Jinja chat template stored in the embedded model's GGUF file (its `tokenizer.chat_template`)."""
    from llama_cpp import Llama

    model = Llama(model_path=default_model_path(), vocab_only=True, verbose=False)
    return model.metadata["tokenizer.chat_template"]


def render(template: str, line: dict) -> str:
    """What transformers' apply_chat_template makes of an export line, with its tools."""
    from tokenizers import Tokenizer
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(BPE()), chat_template=template)
    return tokenizer.apply_chat_template(line["messages"], tools=line["tools"], tokenize=False)


def assert_in_order(text: str, pieces: list[str]) -> None:
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        assert found >= 0, f"{piece!r} missing after position {at} in:\n{text}"
        at = found + len(piece)


def test_openai_lines_render_through_the_embedded_models_own_template(exported):
    """SmolLM2's template (from its GGUF) renders each message's content: every prompt, answer and tool result,
    in order. It has no place for tool calls or reasoning, which the next test renders."""
    template = gguf_chat_template()
    assert "message['content']" in template
    lines = read_jsonl(exported / "export" / "openai" / "data.jsonl")
    for line in lines:
        text = render(template, line)
        assert_in_order(text, [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>" for m in line["messages"]])
    results = [m for line in lines for m in line["messages"] if m["role"] == "tool"]
    assert len(results) >= 8


def test_openai_lines_render_every_tool_call_and_result_through_a_tool_calling_template(exported):
    """Llama 4's chat template (shipped inside transformers) renders tools, tool calls and results."""
    from transformers.models.llama4.processing_llama4 import chat_template

    lines = read_jsonl(exported / "export" / "openai" / "data.jsonl")
    calls_seen = 0
    for line in lines:
        text = render(chat_template, line)
        pieces = []
        for m in line["messages"]:
            for call in m.get("tool_calls") or ():
                pieces.append(f'{{"name": "{call["function"]["name"]}", "parameters": ')
                pieces.append(json.dumps(call["function"]["arguments"], ensure_ascii=False))
                calls_seen += 1
            if m["role"] == "tool":
                # the template writes a string result with tojson (a Jinja string is iterable)
                content = json.dumps(m["content"], ensure_ascii=False)
                pieces.append(f"<|header_start|>ipython<|header_end|>\n\n{content}<|eot|>")
        assert_in_order(text, pieces)
        for tool in line["tools"]:
            assert f'"name": "{tool["function"]["name"]}"' in text
    assert calls_seen >= 10


def test_inspect_log_reads_back_with_every_outcome(exported):
    from inspect_ai.log import read_eval_log

    logs = list((exported / "export" / "inspect").glob("*.eval"))
    assert len(logs) == 1
    log = read_eval_log(str(logs[0]))
    records = batch_records(exported)
    outcomes = [s.scores["outcome"].value for s in log.samples]
    assert outcomes.count("discarded") == 2 and outcomes.count("failed") == 1
    assert len(log.samples) == len(records) + 3
    failed = next(s for s in log.samples if s.scores["outcome"].value == "failed")
    assert failed.input == "p-fail" and "HTTP 400" in failed.error.message
    discarded = next(s for s in log.samples if s.input == "p-noreason")
    assert discarded.metadata["discard_reason"] == "no_reasoning"
    parallel = next(s for s in log.samples if s.input == "p-parallel" and s.epoch == 1)
    calls = parallel.messages[1].tool_calls
    assert [c.arguments for c in calls] == [{"command": "echo one"}, {"command": "echo two"}]
    assert [m.tool_call_id for m in parallel.messages[2:4]] == [c.id for c in calls]
    assert (
        parallel.output.usage.total_tokens
        == next(r for r in records if r["conversations"][0]["value"] == "p-parallel")["usage"]["total_tokens"]
    )
    # Only a check that gave a result is scored; every sample's metadata holds its outcome.
    checked = [s for s in log.samples if "check" in s.scores]
    assert checked and all(s.metadata["check"]["status"] in ("passed", "failed") for s in checked)
    assert {s.epoch for s in checked} == {1, 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Chromium missing")
def test_inspect_view_shows_the_run_in_chromium(exported, tmp_path):
    from playwright.sync_api import sync_playwright

    port = _free_port()
    viewer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inspect_ai",
            "view",
            "--log-dir",
            str(exported / "export" / "inspect"),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120  # the viewer takes seconds to import on a loaded machine
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert viewer.poll() is None, "inspect view exited"
            time.sleep(0.5)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()
                page.goto(f"http://127.0.0.1:{port}/", timeout=60_000)
                page.get_by_text("p-parallel").first.wait_for(timeout=60_000)
                body = page.inner_text("body")
                assert "exported" in body and "discarded" in body
                page.get_by_text("p-parallel").first.click()
                page.get_by_text("echo two").first.wait_for(timeout=60_000)
            finally:
                browser.close()
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)
