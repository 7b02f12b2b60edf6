"""--token_ids with the embedded model: the child records what `Llama.generate` saw and sampled, in vLLM's shape;
a two-call sample through the real client and the real server, checked against llama.cpp's own vocabulary; a
CLI sample whose tool call came without ids, retokenized with the GGUF file's template (torch), and without
torch null tokens said in one line."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap

import pytest
from cli_helpers import ROOT, RunDir, assert_clean_exit, run_cli, write_dataset

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


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("gguf") is None,
    reason="transformers reads a GGUF file's tokenizer only with torch and gguf (the trl extra: README, Development)",
)
def test_a_cli_sample_with_tool_calls_is_retokenized_and_only_its_assistant_turns_are_masked(tmp_path):
    """With tools offered the first call runs several completions (no ids): the whole sample is retokenized with
    the GGUF file's chat template. Read back with llama.cpp's own vocabulary, each run of 1s in the mask is one
    assistant turn as that template renders it, and the prompt and the tool's result are all 0s."""
    from llama_cpp import Llama

    # The prompt the embedded model answers with a terminal call (4 of 4 tries; "Say hello." with none).
    data = write_dataset(tmp_path / "ds.jsonl", ["List the files in the current directory."])
    args = [f"--dataset_file={data}", "--batch_size=1", "--run_name=l", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=local", "--require_reasoning=false", "--distribution=terminal_only", "--token_ids"]
    done = run_cli([*args, "--max_turns=2", "--max_tokens=32"], tmp_path)
    assert_clean_exit(done)
    assert "cannot retokenize" not in done.stderr
    (line,) = RunDir(tmp_path / "out" / "l").trajectories()
    tokens = line["tokens"]
    ids, mask = tokens["ids"], tokens["mask"]
    assert tokens["source"] == "retokenized" and tokens["drift"] is None
    assert tokens["logprobs"] == [None] * len(ids)  # the endpoint's belong to ids we do not have
    vocab = Llama(local_server.default_model_path(), vocab_only=True, verbose=False)

    def text(part: list[int]) -> str:
        return vocab.detokenize(part, special=True).decode()

    starts = [i for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])]
    ends = [i + 1 for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    # Its tool call, then (tool_choice "none" after a result: adapt_request) its answer.
    turns = [t for t in line["conversations"] if t["from"] == "gpt"]
    assert [t["from"] for t in line["conversations"]] == ["human", "gpt", "tool", "gpt"], line["conversations"]
    assert len(starts) == len(tokens["calls"]) == len(turns) == 2
    for n, (start, end) in enumerate(zip(starts, ends, strict=True)):
        assert text(ids[:start]).endswith("<|im_start|>assistant\n")
        span = text(ids[start:end])
        assert "<|im_start|>" not in span
        # Each turn ends where the model ended it; an answer cut by --max_tokens without the end of turn.
        cut = n == len(starts) - 1 and line["stop_reason"] == "length"
        assert span.endswith("<|im_end|>") != cut
    unmasked = text([i for i, m in zip(ids, mask, strict=True) if not m])
    assert "List the files in the current directory." in unmasked
    (result,) = [t for t in line["conversations"] if t["from"] == "tool"]
    assert result["value"] in unmasked


def test_without_torch_a_gguf_tokenizer_leaves_tokens_null_and_one_line_says_why():
    """transformers' GGUF reader imports torch: in an interpreter where torch cannot be imported (hidden here, as
    on a machine without it), a sample to retokenize from the GGUF file gets null tokens, said in one line."""
    code = textwrap.dedent(
        """
        import logging, sys
        sys.modules["torch"] = None  # importing it fails, and find_spec says it is not there
        logging.basicConfig(format="%(message)s")
        from agentbatch.model import local_server
        from agentbatch.sample_tokens import Call, TokenRecorder
        recorder = TokenRecorder(local_server.default_model_path())
        reply = {"role": "assistant", "content": "Hello."}
        recorder.calls.append(Call([{"role": "user", "content": "Say hello."}], [], reply, None, None))
        print(recorder.tokens())
        """
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr
    (said,) = [x for x in done.stderr.splitlines() if "cannot retokenize" in x]
    assert "torch" in said and "Traceback" not in done.stderr


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
