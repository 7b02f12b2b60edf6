"""The rules under --token_ids' `tokens`: which reply shape gives which ids, and the mask and drift built from
each call's prompt and completion (the CLI runs are in test_token_ids.py)."""

from __future__ import annotations

from agentbatch.model.token_ids import CallTokens, call_tokens
from agentbatch.sample_tokens import build


def entries(*pairs):
    return {"content": [{"token": t, "logprob": lp} for t, lp in pairs]}


def test_each_server_shape_is_read_by_its_own_adapter():
    vllm = {"prompt_token_ids": [1, 2], "choices": [{"token_ids": [7, 8], "logprobs": entries(("a", -0.5), ("b", -1))}]}
    assert call_tokens(vllm) == CallTokens([1, 2], [7, 8], [-0.5, -1.0], "vllm")
    sglang = {"choices": [{"prompt_token_ids": [1], "response_token_ids": [9]}]}
    assert call_tokens(sglang) == CallTokens([1], [9], [None], "sglang")
    sglext = {"choices": [{"index": 0}], "sglext": {"input_ids": [3], "output_ids": [[4, 5]]}}
    assert call_tokens(sglext) == CallTokens([3], [4, 5], [None, None], "sglext")
    llama = {"choices": [{"logprobs": {"content": [{"id": 6, "token": "x", "logprob": -2}]}}]}
    assert call_tokens(llama) == CallTokens(None, [6], [-2.0], "llama-server")
    spelled = {"choices": [{"logprobs": entries(("token_id:11", -0.25), ("token_id:12", None))}]}
    assert call_tokens(spelled) == CallTokens(None, [11, 12], [-0.25, None], "llama-server")


def test_what_is_not_a_list_of_ids_is_no_ids_and_uneven_logprobs_are_not_guessed():
    assert call_tokens({"prompt_token_ids": [1, True], "choices": [{"token_ids": [2]}]}) is None
    assert call_tokens({"prompt_token_ids": [1], "choices": [{"token_ids": [-2]}]}) is None
    assert call_tokens({"choices": [{"message": {"content": "hi"}, "logprobs": entries(("hi", -1))}]}) is None
    assert call_tokens({"choices": []}) is None and call_tokens("no") is None
    short = {"prompt_token_ids": [1], "choices": [{"token_ids": [2, 3], "logprobs": entries(("a", -1))}]}
    assert call_tokens(short).logprobs == [None, None]  # one logprob for two ids: which one is it? neither


def test_the_mask_marks_each_calls_completion_and_the_template_between_them_is_zero():
    calls = [CallTokens([1, 2], [3, 4], [-0.1, -0.2], "vllm"), CallTokens([1, 2, 3, 4, 5, 6], [7], [-0.3], "vllm")]
    tokens = build(calls, ["a", "b"], "endpoint")
    assert tokens["ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert tokens["mask"] == [0, 0, 1, 1, 0, 0, 1]
    assert tokens["logprobs"] == [None, None, -0.1, -0.2, None, None, -0.3]
    assert tokens["calls"] == [
        {"prompt": 2, "completion": 2, "policy_version": "a"},
        {"prompt": 6, "completion": 1, "policy_version": "b"},
    ]
    assert tokens["drift"] is None


def test_a_prompt_that_rewrites_or_drops_the_history_is_drift_and_loses_its_ones():
    first = CallTokens([1, 2], [3, 4], [None, None], "vllm")
    rewritten = build([first, CallTokens([1, 2, 3, 9, 5], [6], [None], "vllm")], [None, None], "endpoint")
    assert rewritten["drift"] == [{"call": 1, "at": 3, "expected": 4, "got": 9}]
    assert rewritten["ids"] == [1, 2, 3, 9, 5, 6]
    assert rewritten["mask"] == [0, 0, 1, 0, 0, 1]  # the 3 is still as sampled; the 9 never was
    shorter = build([first, CallTokens([1, 2, 3], [8], [None], "vllm")], [None, None], "endpoint")
    assert shorter["drift"] == [{"call": 1, "at": 3, "expected": 4, "got": None}]
    assert shorter["ids"] == [1, 2, 3, 8] and shorter["mask"] == [0, 0, 1, 1]
