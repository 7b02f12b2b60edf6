"""The command line read without Fire gives the CLI exactly the values Fire gives it, or leaves the line to Fire."""

from __future__ import annotations

import fire
import pytest

from agentbatch import flags
from agentbatch.command_line import keyword_values

LINES = [
    ["--dataset_file=data/prompts.jsonl", "--batch_size=10", "--run_name=my_first_run", "--num_workers=4"],
    ["--dataset_file", "x.jsonl", "--batch_size", "10", "--run_name", "r", "--resume"],
    ["--resume", "--verbose", "--seed=0", "--max_samples=007", "--request_timeout=1e3", "--docker_cpus=.5"],
    ["--providers_allowed=alpha,beta", '--providers_ignored="gamma,delta"', "--providers_order=[a,b]"],
    ["--model", "vendor/model-1.5", "--ephemeral_system_prompt=Be brief, please", "--api_key=123"],
    ["--run_name=None", "--model=True", "--base_url=http://127.0.0.1:8000/v1", "--distribution=default"],
    ["--require_reasoning=false", "--reasoning_disabled=True", "--allow_private_urls=1", "--num-workers=3"],
    ["--num_workers=abc", "--concurrency=1.5", "--max_turns=-2", "--log_prefix_chars=0x10", "--seed=1_000"],
    ["--max_retries=(1,2)", "--moa_models=a, b", "--vision_model=", "--batch_size=", "--docker_memory=2g"],
    ["--seed={'a': 1}", "--max_turns=lambda", "--concurrency=if", "--output_dir=é/ü", "--num_workers=f(x)"],
    ["--list_distributions"],
    [],
]
LEFT_TO_FIRE = [
    ["--help"],
    ["-h"],
    ["positional"],
    ["--bogus_flag=1"],
    ["--num_workers=1", "--num_workers=2"],
    ["--noresume"],
    ["--seed", "-5"],
    ["--model", "-x"],
    ["--", "--help"],
]


def fire_values(argv: list[str]) -> dict:
    """What Fire passes to the CLI for this command line."""
    seen: dict = {}

    def capture(**values):
        seen.update(values)

    capture.__signature__ = flags.signature()
    fire.Fire(capture, command=flags.quote_text_flags(argv), name="batch-runner")
    return seen


@pytest.mark.parametrize("argv", LINES, ids=lambda a: " ".join(a)[:60] or "empty")
def test_values_are_what_fire_gives(argv):
    ours = keyword_values(argv)
    theirs = fire_values(argv)
    assert ours == theirs
    assert [type(v) for v in ours.values()] == [type(v) for v in theirs.values()]


@pytest.mark.parametrize("argv", LEFT_TO_FIRE, ids=lambda a: " ".join(a))
def test_unusual_lines_are_left_to_fire(argv):
    assert keyword_values(argv) is None
