"""Shared by the verified-outcome tests: reply specs, run arguments, and reading outcomes back by prompt."""

from __future__ import annotations

import math
from collections import defaultdict

from cli_helpers import prompt_of_record


def sh(command: str) -> dict:
    """A reply that runs one terminal command."""
    return {"tool_calls": [{"name": "terminal", "arguments": {"command": command}}]}


def answer(text: str) -> dict:
    return {"content": text}


def args_for(dataset, out_dir, run_name: str = "v", *extra: str) -> list[str]:
    return [
        f"--dataset_file={dataset}",
        "--batch_size=5",
        f"--run_name={run_name}",
        f"--output_dir={out_dir}",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--max_retries=0",
        "--num_workers=2",
        "--concurrency=4",
        # Checks that reach outside their sandbox (a pid file, the runner's /proc) are written for the local
        # sandbox; the bwrap and docker tests name theirs.
        *([] if any(e.startswith("--sandbox=") for e in extra) else ["--sandbox=local"]),
        *extra,
    ]


def by_prompt(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[prompt_of_record(r)].append(r)
    return out


def expected_pass_at_k(results: list[tuple[int, int]], k: int) -> float:
    """The mean over prompts with n >= k of 1 - C(n-c, k) / C(n, k), from (n, c) pairs (the Codex paper's estimator)."""
    values = [1 - math.comb(n - c, k) / math.comb(n, k) for n, c in results if n >= k]
    return sum(values) / len(values)
