"""Cost in statistics.json and the run's budget, through the real CLI against the scripted server."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from cli_helpers import RunDir, assert_clean_exit, first_turn_prompts, prompt_of_record, run_cli, write_dataset
from scripted_server import ScriptedServer

from agentbatch.budget import Budget, BudgetSettings, Spend

CALL_COST = 0.01  # what the scripted endpoint reports for each call (as OpenRouter does)
ARGS = ["--batch_size=5", "--distribution=terminal_only", "--require_reasoning=false", "--max_retries=0"]


def usage(cost: float = CALL_COST) -> dict:
    return {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120, "cost": cost}


def one_call(**extra) -> list[dict]:
    return [{"content": "answer", "usage": usage(), "latency": 0.2, **extra}]


def spend_in(run: RunDir) -> tuple[float, int]:
    """USD and tokens over every line of the run: trajectories, discards and failed attempts."""
    lines = run.trajectories() + run.discarded() + run.failed()
    return math.fsum(line["usage"].get("cost", 0.0) for line in lines), sum(
        line["usage"]["total_tokens"] for line in lines
    )


def test_costs_in_statistics_equal_the_sum_over_the_files(tmp_path):
    script = {
        "reported": [
            {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo a"}}], "usage": usage(0.0123)},
            {"content": "done", "reasoning": "r", "usage": usage(0.0456)},
        ],
        "priced": [{"content": "from prices", "reasoning": "r"}],  # no cost reported: priced from the flags
        "discarded": [{"content": "no reasoning", "usage": usage(0.002)}],
        "fails": [{"fault": "500", "fault_times": -1}],
    }
    write_dataset(tmp_path / "ds.jsonl", list(script))
    args = ["--dataset_file=ds.jsonl", "--run_name=cost", "--batch_size=5", "--distribution=terminal_only"]
    args += ["--max_retries=0", "--price_input=3", "--price_output=15", "--num_workers=2"]
    with ScriptedServer(script=script) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, 3)
    run = RunDir(tmp_path / "data" / "cost")
    records = {prompt_of_record(r): r for r in run.trajectories()}
    assert records["reported"]["usage"]["cost"] == pytest.approx(0.0123 + 0.0456)
    # The default scripted usage, 10 prompt + 5 completion tokens, at $3 and $15 per million.
    assert records["priced"]["usage"]["cost"] == pytest.approx((10 * 3 + 5 * 15) / 1e6)
    stats = run.stats()
    cost = stats["cost"]
    trajectories = math.fsum(r["usage"]["cost"] for r in run.trajectories())
    discarded = math.fsum(d["usage"]["cost"] for d in run.discarded())
    failed = math.fsum(f["usage"]["cost"] for f in run.failed())
    assert cost["trajectories"] == pytest.approx(trajectories, abs=1e-9)
    assert cost["discarded"] == pytest.approx(discarded, abs=1e-9) and discarded == pytest.approx(0.002)
    assert cost["failed_attempts"] == pytest.approx(failed, abs=1e-9)
    total, tokens = spend_in(run)
    assert cost["total"] == pytest.approx(total, abs=1e-9)
    assert cost["per_completed"] == pytest.approx(total / stats["completed"], abs=1e-9)
    assert cost["per_passing"] is None  # no rewards in this run
    (model,) = stats["by_model"]
    assert stats["by_model"][model]["cost"] == pytest.approx(total, abs=1e-9)
    assert stats["by_model"][model]["tokens"] == tokens
    assert stats["by_model"][model]["failed_attempts"] == 1 and stats["by_model"][model]["discarded"] == 1
    # Every line of a terminal_only run was offered both toolsets.
    for toolset in ("terminal", "file"):
        assert stats["by_toolset"][toolset]["cost"] == pytest.approx(total, abs=1e-9)
        assert stats["by_toolset"][toolset]["trajectories"] == len(records)
    assert f"cost: ${total:.4f}" in proc.stdout


def budget_run(tmp_path, srv, *flags: str, code: int):
    # Prices let a dollar budget start on an endpoint that is not OpenRouter; the reported cost still wins.
    args = ["--dataset_file=ds.jsonl", "--run_name=budget", *ARGS, "--num_workers=2", "--concurrency=4"]
    args += ["--price_input=1", "--price_output=1", *flags]
    proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, code)
    return proc


def test_the_budget_stops_new_prompts_and_a_resume_with_a_larger_one_runs_exactly_the_rest(tmp_path):
    prompts = [f"budget prompt {i}" for i in range(20)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    run = RunDir(tmp_path / "data" / "budget")
    budget = 0.1
    with ScriptedServer(default_script=one_call()) as srv:
        first = budget_run(tmp_path, srv, f"--budget_usd={budget}", code=4)
        spent, _ = spend_in(run)
        done = len(run.trajectories())
        # Never more than one prompt's worth over; and the budget is used, not left mostly idle.
        assert spent <= budget + CALL_COST + 1e-9
        assert spent >= budget - 3 * CALL_COST and 7 <= done <= 10
        stats = run.stats()
        assert stats["prompts"]["not_run"] == 20 - done and stats["prompts"]["failed"] == 0
        assert f"{20 - done} samples not run" in first.stderr and "budget reached" in first.stderr
        assert run.json("checkpoint.json")["state"] == "budget_spent"

        # The same budget again: already spent, so nothing starts and nothing is asked of the endpoint.
        asked = len(srv.requests())
        again = budget_run(tmp_path, srv, f"--budget_usd={budget}", "--resume", code=4)
        assert len(srv.requests()) == asked and len(run.trajectories()) == done
        assert "budget reached" in again.stderr

        budget_run(tmp_path, srv, "--budget_usd=1", "--resume", code=0)
        started = first_turn_prompts(srv)
    assert started == Counter(prompts), "each prompt must be run exactly once over the sessions"
    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter(prompts)
    assert run.stats()["prompts"]["not_run"] == 0
    assert run.stats()["cost"]["total"] == pytest.approx(20 * CALL_COST, abs=1e-9)


def test_a_token_budget_counts_failed_attempts_too(tmp_path):
    prompts = [f"token prompt {i}" for i in range(12)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    run = RunDir(tmp_path / "data" / "budget")
    with ScriptedServer(default_script=one_call()) as srv:
        budget_run(tmp_path, srv, "--budget_tokens=700", code=4)
    _, tokens = spend_in(run)
    assert tokens <= 700 + 120 and len(run.trajectories()) >= 3


def test_a_dollar_budget_without_any_way_to_know_costs_is_refused(tmp_path):
    write_dataset(tmp_path / "ds.jsonl", ["x"])
    with ScriptedServer(default_script=one_call()) as srv:
        proc = run_cli(["--dataset_file=ds.jsonl", "--run_name=b", *ARGS, "--budget_usd=5"], tmp_path, srv)
    assert_clean_exit(proc, 2)
    assert "--budget_usd needs costs" in proc.stderr and "--price_input" in proc.stderr
    assert not (tmp_path / "data" / "b").exists()


def test_admission_projects_the_prompts_in_flight():
    budget = Budget(BudgetSettings(usd=1.0), Spend())
    assert budget.may_start(0) and not budget.may_start(1)  # nothing known: one at a time
    capped = Budget(BudgetSettings(usd=1.0, usd_per_prompt=0.2), Spend())
    assert capped.may_start(4) and not capped.may_start(5)  # the per-prompt limit bounds each one
    known = Budget(BudgetSettings(usd=1.0), Spend(cost=0.5, tokens=0, attempts=100, paid=100))  # $0.005 a prompt
    assert known.may_start(80) and not known.may_start(100)
    assert not Budget(BudgetSettings(usd=1.0), Spend(cost=1.0, attempts=3, paid=3)).may_start(0)
    assert known.samples_left(10) == 90


def test_attempts_that_spent_nothing_say_nothing_about_what_a_prompt_costs():
    spend = Spend()
    for _ in range(50):
        spend.add({"total_tokens": 0, "cost": 0.0})  # failed setups, missing images, 4xx
    assert (spend.attempts, spend.paid) == (50, 0)
    budget = Budget(BudgetSettings(usd=1.0), spend)
    assert budget.may_start(0) and not budget.may_start(1) and budget.mean_cost() is None
    spend.add({"total_tokens": 30, "cost": 0.05})
    assert budget.mean_cost() == pytest.approx(0.05)
    assert budget.may_start(5) and not budget.may_start(6)  # $0.05 + 6 x $0.15 projected: the 50 others count not


def test_the_per_prompt_limit_bounds_the_projection_after_prompts_finished_too():
    spend = Spend(cost=0.06, attempts=1, paid=1)  # one costly prompt: a mean x 3 of $0.18 would allow none
    assert not Budget(BudgetSettings(usd=0.2), spend).may_start(0)
    capped = Budget(BudgetSettings(usd=0.2, usd_per_prompt=0.02), spend)
    assert capped.may_start(6) and not capped.may_start(7)
    cheap = Budget(BudgetSettings(usd=0.2, usd_per_prompt=0.02), Spend(cost=0.001, attempts=1, paid=1))
    assert cheap.may_start(10)  # a mean (x 3) below the limit projects less than it


def test_a_usage_of_another_shape_counts_nothing():
    spend = Spend()
    for usage in (None, "x", {"total_tokens": "12"}, {"total_tokens": True}, {"total_tokens": -5, "cost": "x"}):
        spend.add(usage)
    assert (spend.cost, spend.tokens, spend.attempts, spend.paid) == (0.0, 0, 5, 0)


PAID = {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30, "cost": 0.02}


@pytest.mark.parametrize(
    "flags, over",
    [
        (("--budget_usd=0.1",), lambda usd, tokens: usd - 0.1),
        (("--budget_usd=0.1", "--max_cost_per_prompt=0.02"), lambda usd, tokens: usd - 0.1),
        (("--budget_tokens=150",), lambda usd, tokens: (tokens - 150) / 30 * 0.02),
    ],
    ids=["usd", "usd_with_per_prompt_limit", "tokens"],
)
def test_zero_cost_failures_do_not_open_every_slot(tmp_path, flags, over):
    """Issue 26 item 1: a row whose setup fails spends nothing; the projection must not take it for a cheap prompt.

    Before, the mean over every finished attempt was $0 after it, every slot was admitted, and 32 prompts ran.
    """
    rows = [{"prompt": "broken", "setup": "echo no repo >&2; exit 4"}] + [f"paid prompt {i}" for i in range(60)]
    write_dataset(tmp_path / "ds.jsonl", rows)
    run = RunDir(tmp_path / "data" / "budget")
    args = ["--dataset_file=ds.jsonl", "--run_name=budget", *ARGS, "--concurrency=32", "--sandbox=local"]
    args += ["--price_input=1", "--price_output=1", *flags]
    with ScriptedServer(default_script=[{"content": "answer", "usage": PAID, "latency": 0.3}]) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, 4)
    usd, tokens = spend_in(run)
    assert len(run.failed()) == 1 and run.failed()[0]["prompt"] == "broken"
    # At most about one prompt's worth over (README, "Budget"), never a slot's worth each.
    assert over(usd, tokens) <= 0.02 + 1e-9, proc.stderr
    assert len(run.trajectories()) >= 2


def test_earlier_sessions_zero_cost_failures_do_not_dilute_the_projection_on_resume(tmp_path):
    broken = [{"prompt": f"broken {i}", "setup": "exit 4"} for i in range(10)]
    write_dataset(tmp_path / "ds.jsonl", broken)
    run = RunDir(tmp_path / "data" / "budget")
    args = ["--dataset_file=ds.jsonl", "--run_name=budget", *ARGS, "--concurrency=32", "--sandbox=local"]
    args += ["--price_input=1", "--price_output=1"]
    with ScriptedServer(default_script=[{"content": "answer", "usage": PAID, "latency": 0.3}]) as srv:
        assert_clean_exit(run_cli(args, tmp_path, srv), 3)
        assert len(run.failed()) == 10
        # The same rows (failing again, after the paid ones) and 40 paid prompts, resumed with a budget.
        write_dataset(tmp_path / "ds.jsonl", [f"paid prompt {i}" for i in range(40)] + broken)
        proc = run_cli([*args, "--resume", "--budget_usd=0.1"], tmp_path, srv)
    assert_clean_exit(proc, 4)
    usd, _ = spend_in(run)
    assert usd <= 0.1 + 0.02 + 1e-9, proc.stderr
