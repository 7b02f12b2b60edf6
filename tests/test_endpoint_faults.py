"""A faulty endpoint never kills the run: each prompt ends as a trajectory or a failure with its reason."""

from __future__ import annotations

from collections import Counter

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, write_dataset
from scripted_server import ScriptedServer

# What failed.jsonl says for each fault once the retries are used up (model_client._describe).
REASONS = {
    "500": "HTTP 500",
    "429": "HTTP 429",
    "drop": "connection failed or dropped",
    "malformed": "malformed reply",
    "slow": "request timed out",
    "400": "request rejected: HTTP 400",
}
RATES = {"500": 0.10, "429": 0.05, "drop": 0.02, "malformed": 0.02, "slow": 0.01}
TOOL_TURN = {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo tool ran"}}]}
FINAL = {"content": "finished", "reasoning": "done thinking"}


def cli_args(data, out, srv, *extra) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=20",
        "--run_name=faults",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=fault-test-key",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--num_workers=2",
        "--request_timeout=1",
        "--max_retries=1",
        *extra,
    ]


def assert_every_prompt_accounted(run: RunDir, prompts: list[str]) -> tuple[set, list[dict]]:
    """Each prompt is a trajectory or a failure with a known reason, never both, never lost."""
    done = Counter(prompt_of_record(r) for r in run.trajectories())
    failed = run.failed()
    failed_prompts = Counter(f["prompt"] for f in failed)
    assert all(n == 1 for n in done.values()), "a prompt has two trajectories"
    assert all(n == 1 for n in failed_prompts.values()), "a prompt failed twice in one session"
    assert not set(done) & set(failed_prompts)
    assert Counter(done) + failed_prompts == Counter(prompts)
    for f in failed:
        assert any(r in f["error"] for r in REASONS.values()), f["error"]
        assert f["timestamp"] and isinstance(f["prompt_index"], int)
    return set(failed_prompts), failed


def test_each_fault_kind_fails_its_prompt_with_the_reason_then_resume_finishes(tmp_path):
    """Scripted faults that outlast --max_retries=1 (two attempts), then stop: deterministic reasons."""
    script = {"healthy": [TOOL_TURN, FINAL]}
    for kind in REASONS:
        bad = {"fault": kind, "fault_times": 1 if kind == "400" else 2, "slow_seconds": 3, **FINAL}
        # The fault hits the second call, so a failing prompt has already run a tool.
        script[f"fault {kind}"] = [TOOL_TURN, bad]
    script["context"] = [TOOL_TURN, {"fault": "context_length", "fault_times": 1, **FINAL}]
    prompts = list(script)
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    run = RunDir(tmp_path / "data" / "faults")
    with ScriptedServer(script=script) as srv:
        first = run_cli(cli_args(data, tmp_path / "data", srv, "--concurrency=8"), tmp_path)
        assert_clean_exit(first, 3)
        failed, records = assert_every_prompt_accounted(run, prompts)
        assert failed == {f"fault {k}" for k in REASONS}
        for f in records:
            assert REASONS[f["prompt"].split()[1]] in f["error"], f
        # An overflowing context is not a failure: the sample is kept, marked partial.
        context = next(r for r in run.trajectories() if prompt_of_record(r) == "context")
        assert context["partial"] is True and context["completed"] is False
        assert run.stats()["prompts"]["failed"] == len(REASONS)
        assert "samples failed (see failed.jsonl)" in first.stderr

        second = run_cli(cli_args(data, tmp_path / "data", srv, "--concurrency=8", "--resume"), tmp_path)
    assert_clean_exit(second, 0)
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    assert len(run.failed()) == len(REASONS), "failed.jsonl keeps the history of failed attempts"
    stats = run.stats()
    assert stats["prompts"]["failed"] == 0 and stats["prompts"]["done"] == len(prompts)


@pytest.mark.slow
def test_random_faults_at_realistic_rates_then_resume_after_they_stop(tmp_path):
    prompts = [f"faulty endpoint prompt {i}" for i in range(150)]
    data = write_dataset(tmp_path / "ds.jsonl", prompts)
    run = RunDir(tmp_path / "data" / "faults")
    server = ScriptedServer(
        default_script=[TOOL_TURN, FINAL], latency=0.02, fault_rates=RATES, slow_seconds=3.0, seed=9
    )
    with server as srv:
        first = run_cli(cli_args(data, tmp_path / "data", srv, "--concurrency=24"), tmp_path)
        assert_clean_exit(first, 3)
        failed, records = assert_every_prompt_accounted(run, prompts)
        # ~20% of calls fault and two in a row fail a prompt (~8% of prompts): far from all, far from none.
        assert 1 <= len(failed) <= 40
        assert run.stats()["prompts"] == {
            "total": len(prompts),
            "done": len(prompts) - len(failed),
            "discarded": 0,
            "failed": len(failed),
            "not_run": 0,
        }
        seen = {kind for kind, reason in REASONS.items() if any(reason in f["error"] for f in records)}
        assert "500" in seen, f"the commonest fault never failed a prompt: {seen}"
        asked = len(srv.requests())

        srv.set_fault_rates({})
        second = run_cli(cli_args(data, tmp_path / "data", srv, "--concurrency=24", "--resume"), tmp_path)
        resumed_prompts = {b["messages"][0]["content"] for b in srv.requests()[asked:]}
    assert_clean_exit(second, 0)
    assert resumed_prompts == failed, "the resume must re-run exactly the failed prompts"
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    stats = run.stats()
    assert stats["prompts"]["failed"] == 0 and stats["prompts"]["done"] == len(prompts)
    assert stats["merge"]["kept"] == len(prompts)
