"""Numbers an endpoint sends (Retry-After, token counts, costs, log probabilities) that are no numbers of their kind.

Each is read once, by agentbatch/model/numbers.py, where it arrives: through the real CLI none is an internal
error, and the call's spend is still counted (a cost that is not one is priced from the tokens).
"""

from __future__ import annotations

import json

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from agentbatch.model import numbers
from agentbatch.model.rate_limit import retry_after

HUGE = 10**400  # json writes it; float() of it overflows
PRICE = 1.0  # USD per million tokens, input and output
# Retry-After values that are no wait: each is retried after the client's own backoff.
NO_WAITS = ["nan", "NaN", "inf", "-inf", "\u00b2", "0x10", "1_0", ""]
# prompt -> (usage the endpoint sends, the prompt_tokens, completion_tokens, total_tokens and cost recorded)
USAGES = {
    "a superscript two as prompt_tokens": (
        {"prompt_tokens": "\u00b2", "completion_tokens": 5, "total_tokens": 15},
        0,
        5,
        15,
        5e-6,
    ),
    "a cost of 401 digits": (
        {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": HUGE},
        10,
        5,
        15,
        15e-6,
    ),
    "a cost of NaN": (
        {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": float("nan")},
        10,
        5,
        15,
        15e-6,
    ),
    "a cost of Infinity": ({"prompt_tokens": 10, "completion_tokens": 5, "cost": float("inf")}, 10, 5, 15, 15e-6),
    "a cost as text": (
        {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": "0.25"},
        10,
        5,
        15,
        0.25,
    ),
    "a negative cost": (
        {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": -3},
        10,
        5,
        15,
        15e-6,
    ),
    "a token count of 401 digits": (
        {"prompt_tokens": HUGE, "completion_tokens": 5, "total_tokens": HUGE},
        0,
        5,
        5,
        5e-6,
    ),
    "a token count of 1e300": ({"prompt_tokens": 10, "completion_tokens": 1e300, "total_tokens": 15}, 10, 0, 15, 10e-6),
    "a token count of 12.0": (
        {"prompt_tokens": 12.0, "completion_tokens": "3", "total_tokens": True},
        12,
        3,
        15,
        15e-6,
    ),
    "Arabic digits": ({"prompt_tokens": "\u0661\u0662", "completion_tokens": 3, "total_tokens": 15}, 0, 3, 15, 3e-6),
}


def _args(data, out, srv, *extra) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=50",
        "--run_name=numbers",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=numbers-key",
        "--distribution=terminal_only",
        "--num_workers=1",
        "--concurrency=8",
        "--max_retries=2",
        f"--price_input={PRICE}",
        f"--price_output={PRICE}",
        *extra,
    ]


def test_no_number_an_endpoint_sends_is_an_internal_error_and_each_call_is_counted(tmp_path):
    script = {f"retry after {v!r}": [{"fault": "429", "retry_after": v, **thinking("waited")}] for v in NO_WAITS}
    script.update({prompt: [thinking("counted", usage=usage)] for prompt, (usage, *_) in USAGES.items()})
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with ScriptedServer(script=script) as srv:
        proc = run_cli(_args(data, tmp_path / "out", srv), tmp_path)
        asked = srv.requests()
    assert_clean_exit(proc)
    run = RunDir(tmp_path / "out" / "numbers")
    assert run.failed() == []
    records = {prompt_of_record(r): r for r in run.trajectories()}
    assert sorted(records) == sorted(script)
    for value in NO_WAITS:
        prompt = f"retry after {value!r}"
        assert sum(1 for b in asked if _prompt(b) == prompt) == 2, prompt
        assert records[prompt]["conversations"][-1]["value"].endswith("waited")
    total = 15e-6 * len(NO_WAITS)
    for prompt, (_, p, c, t, cost) in USAGES.items():
        usage = records[prompt]["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (p, c, t), prompt
        assert usage["cost"] == pytest.approx(cost), prompt
        total += cost
    assert run.json("statistics.json")["cost"]["total"] == pytest.approx(total)
    # Every line of the run is JSON any reader takes: no NaN, no Infinity.
    for line in (run.path / "trajectories.jsonl").read_text(encoding="utf-8").splitlines():
        json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} written"))


def _prompt(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def test_log_probabilities_that_are_no_numbers_are_null(tmp_path):
    pairs = [["a", HUGE], ["b", float("nan")], ["c", -0.5], ["d", "-1"]]
    script = {"odd logprobs": [thinking("abcd", logprobs=pairs, token_ids=[1, HUGE, 3, 4])]}
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    with ScriptedServer(script=script) as srv:
        proc = run_cli(_args(data, tmp_path / "out", srv, "--logprobs"), tmp_path)
    assert_clean_exit(proc)
    (record,) = RunDir(tmp_path / "out" / "numbers").trajectories()
    (turn,) = [t for t in record["conversations"] if t["from"] == "gpt"]
    assert turn["logprobs"] == {"tokens": ["a", "b", "c", "d"], "logprobs": [None, None, -0.5, None], "token_ids": []}


@pytest.mark.parametrize(
    "headers, wait",
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": " 1.5 "}, 1.5),
        ({"retry-after": "-4"}, 0.0),
        ({"retry-after": "9" * 401}, numbers.MAX_WAIT_SECONDS),
        ({"retry-after": "1e999"}, numbers.MAX_WAIT_SECONDS),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "nan"}, None),
        *[({"retry-after": v}, None) for v in NO_WAITS],
    ],
)
def test_retry_after_is_a_finite_wait_or_none(headers, wait):
    assert retry_after(headers) == wait
