"""--token_ids with the embedded model: the child records what `Llama.generate` saw and sampled, in vLLM's shape;
a two-call sample through the real client and the real server, checked against llama.cpp's own vocabulary."""

from __future__ import annotations

import importlib.util
import math

import pytest

from agentbatch.model import local_server
from agentbatch.model.client import ModelClient, ModelSettings
from agentbatch.sample_tokens import TokenRecorder

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python[server] is not installed"
)
END_OF_TURN = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def served():
    with local_server.serve(None) as base_url:
        yield base_url


def test_the_masked_ids_are_what_the_embedded_model_sampled(served):
    from llama_cpp import Llama

    vocab = Llama(local_server.default_model_path(), vocab_only=True, verbose=False)
    settings = ModelSettings(
        model="local", base_url=served, api_key="", max_tokens=24, token_ids=True, logprobs=True, policy_version="p1"
    )
    client, recorder = ModelClient(settings), TokenRecorder(None, "p1")
    messages = [{"role": "user", "content": "Name one colour."}]
    replies = []
    for follow_up in ("Name another one.", None):
        reply = client.chat(messages)
        message = reply["choices"][0]["message"]
        assistant = {"role": "assistant", "content": message["content"]}
        recorder.add(list(messages), [], reply, assistant)
        replies.append(reply)
        messages = [*messages, assistant, {"role": "user", "content": follow_up}] if follow_up else messages
    for reply in replies:
        choice = reply["choices"][0]
        sampled, prompt = choice["token_ids"], reply["prompt_token_ids"]
        # What the model sampled, by llama.cpp's own vocabulary: the reply's text, then the end of turn when
        # it stopped (which llama.cpp counts in neither the text nor the usage).
        ended = choice["finish_reason"] == "stop"
        text_ids = sampled[:-1] if ended else sampled
        assert not ended or sampled[-1] == END_OF_TURN
        assert vocab.detokenize(text_ids).decode() == choice["message"]["content"]
        assert len(text_ids) == reply["usage"]["completion_tokens"]
        assert vocab.tokenize(vocab.detokenize(prompt, special=True), add_bos=False, special=True) == prompt
        assert [e["id"] for e in choice["logprobs"]["content"]] == sampled
    tokens = recorder.tokens()
    assert tokens["source"] == "endpoint"
    first, second = (r["choices"][0]["token_ids"] for r in replies)
    masked = [i for i, m in zip(tokens["ids"], tokens["mask"], strict=True) if m]
    assert tokens["ids"] == replies[1]["prompt_token_ids"] + second
    if tokens["drift"] is None:  # llama.cpp's template rendered the first reply as it was sampled
        assert masked == first + second
    else:  # it did not (llama.cpp re-encodes the reply's text): only the ids still as sampled keep their 1s
        (drift,) = tokens["drift"]
        kept = drift["at"] - len(replies[0]["prompt_token_ids"])
        assert drift["call"] == 1 and 0 <= kept < len(first)
        assert drift["expected"] == first[kept] and drift["got"] == tokens["ids"][drift["at"]]
        assert masked == first[:kept] + second
    values = [v for v, m in zip(tokens["logprobs"], tokens["mask"], strict=True) if m]
    assert all(isinstance(v, float) and math.isfinite(v) and v <= 0 for v in values)
    assert [c["policy_version"] for c in tokens["calls"]] == ["p1", "p1"]


def test_a_cli_sample_with_tool_calls_is_retokenized_or_says_in_one_line_why_not(tmp_path):
    """With tools offered the first call runs several completions (no ids): the sample is retokenized from the
    GGUF file's template, which transformers reads only with torch; without it, its tokens are null."""
    from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset

    data = write_dataset(tmp_path / "ds.jsonl", ["Say hello."])
    args = [f"--dataset_file={data}", "--batch_size=1", "--run_name=l", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=local", "--require_reasoning=false", "--distribution=terminal_only", "--token_ids"]
    done = run_cli([*args, "--max_turns=2", "--max_tokens=32"], tmp_path)
    assert_clean_exit(done)
    (line,) = RunDir(tmp_path / "out" / "l").trajectories()
    if importlib.util.find_spec("torch") is None:
        assert line["tokens"] is None
        (said,) = [x for x in done.stderr.splitlines() if "cannot retokenize" in x]
        assert "torch" in said
    else:
        assert line["tokens"]["source"] == "retokenized"


def test_a_request_that_runs_several_completions_gets_no_ids(served):
    """The tool path (chatml-function-calling's choice, arguments, "another call?") has no one sampled sequence."""
    settings = ModelSettings(model="local", base_url=served, api_key="", max_tokens=48, token_ids=True)
    tool = {
        "type": "function",
        "function": {
            "name": "terminal",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        },
    }
    reply = ModelClient(settings).chat([{"role": "user", "content": "List the files here."}], [tool])
    assert "prompt_token_ids" not in reply and "token_ids" not in reply["choices"][0]
