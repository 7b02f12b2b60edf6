"""Failures, discards, unknown-tool entries, duplicates, reordering and kill -9, each followed by --resume."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
from cli_helpers import (
    RunDir,
    assert_clean_exit,
    first_turn_prompts,
    prompt_of_record,
    read_jsonl,
    run_cli,
    start_cli,
    thinking,
    write_dataset,
)
from scripted_server import ScriptedServer

ALWAYS_500 = {"fault": "500", "fault_times": -1}
NO_REASONING = {"content": "an answer without any reasoning"}


def outcome_counts(run: RunDir) -> Counter:
    """Prompt → lines answering it in trajectories.jsonl and discarded.jsonl together."""
    return Counter(prompt_of_record(r) for r in run.trajectories() + run.discarded())


def unknown_tool_record(prompt: str, batch_num: int) -> dict:
    """A batch line as an older version might have written it, calling a tool of no toolset."""
    return {
        "prompt_index": 0,
        "conversations": [
            {"from": "human", "value": prompt},
            {
                "from": "gpt",
                "value": "<think>\nhmm\n</think>\n",
                "tool_calls": [{"id": "call_x", "name": "launch_rockets", "arguments": "{}"}],
            },
            {"from": "tool", "value": '{"error": null}', "tool_call_id": "call_x", "name": "launch_rockets"},
            {"from": "gpt", "value": "<think>\ndone\n</think>\nlaunched"},
        ],
        "metadata": {"batch_num": batch_num, "timestamp": "2026-01-01T00:00:00", "model": "m"},
        "completed": True,
        "partial": False,
        "api_calls": 2,
        "toolsets_used": ["terminal"],
        "tool_stats": {},
        "tool_error_counts": {},
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "tools": "[]",
    }


@pytest.mark.slow
def test_failures_discards_and_unknown_tools_then_resume_reruns_exactly_the_failed(tmp_path):
    dataset = ["alpha", "beta", "gamma fails", "delta no reasoning", "dup", "dup", "epsilon fails", "zeta", "eta hangs"]
    write_dataset(tmp_path / "ds.jsonl", dataset)
    script = {
        "gamma fails": [ALWAYS_500],
        "epsilon fails": [ALWAYS_500],
        "delta no reasoning": [NO_REASONING],
        "eta hangs": [thinking("too late", latency=60)],
    }
    args = [
        "--dataset_file=ds.jsonl",
        "--batch_size=2",
        "--run_name=r",
        "--num_workers=2",
        "--max_retries=1",
        "--request_timeout=2",
    ]
    run = RunDir(tmp_path / "data" / "r")
    with ScriptedServer(script=script, default_script=[thinking("ok")]) as srv:
        first = run_cli(args, tmp_path, srv)
        assert_clean_exit(first, code=3)
        assert "3 samples failed" in first.stderr and "--resume" in first.stderr

        failed = run.failed()
        assert sorted(f["prompt"] for f in failed) == ["epsilon fails", "eta hangs", "gamma fails"]
        for f in failed:
            assert f["prompt_index"] == dataset.index(f["prompt"])
            assert "2 attempts" in f["error"] and f["timestamp"]
            assert ("timed out" in f["error"].lower()) if f["prompt"] == "eta hangs" else ("500" in f["error"])
        # --max_retries=1: two attempts at each failing prompt, no more.
        assert first_turn_prompts(srv)["gamma fails"] == 2
        assert [(d["discard_reason"], prompt_of_record(d)) for d in run.discarded()] == [
            ("no_reasoning", "delta no reasoning")
        ]
        kept = Counter(prompt_of_record(r) for r in run.batch_records())
        assert kept == Counter({"alpha": 1, "beta": 1, "dup": 2, "zeta": 1})
        # Batches are assigned by dataset position: dataset index i is in batch i // 2.
        for r in run.batch_records():
            assert r["metadata"]["batch_num"] == r["prompt_index"] // 2

        # A line calling a tool of no toolset, written by hand for a prompt that failed: the merge must drop it,
        # and resume must still run that prompt, or it would end up nowhere.
        with open(run.path / "batch_5.jsonl", "w", encoding="utf-8") as f:
            f.write(json.dumps(unknown_tool_record("gamma fails", 5)) + "\n")
        before = run.snapshot()

        srv.script["gamma fails"] = [thinking("recovered")]
        srv.script["epsilon fails"] = [thinking("recovered")]
        srv.script["eta hangs"] = [thinking("recovered")]
        since = len(srv.requests())
        second = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(second)
        assert first_turn_prompts(srv, since) == Counter({"gamma fails": 1, "epsilon fails": 1, "eta hangs": 1})

    assert {name: run.snapshot()[name] for name in before} == before, "old batch files were modified"
    new_batches = sorted(set(run.batch_numbers()) - {int(n[6:-6]) for n in before})
    assert new_batches and min(new_batches) == 6, "new batches must follow the highest existing (5)"
    assert {r["metadata"]["batch_num"] for f in new_batches for r in read_jsonl(run.path / f"batch_{f}.jsonl")} == set(
        new_batches
    )

    assert outcome_counts(run) == Counter(dataset)
    assert all("launch_rockets" not in json.dumps(r) for r in run.trajectories())
    stats = run.stats()
    assert stats["merge"]["filtered_unknown_tool"] == 1
    assert stats["prompts"] == {"total": 9, "done": 8, "discarded": 1, "failed": 0, "not_run": 0}
    assert "1 filtered for unknown tools" in second.stdout
    assert run.json("checkpoint.json")["sessions"] == 2


@pytest.mark.slow
def test_duplicates_and_a_reordered_dataset_resume_by_content(tmp_path):
    # One of the two "same" copies fails its only attempt (the fault fires once), the other succeeds.
    script = {"same": [{"fault": "500", "fault_times": 1, "reasoning": "r", "content": "c"}]}
    args = ["--batch_size=2", "--run_name=dups", "--num_workers=1", "--max_retries=0"]
    write_dataset(tmp_path / "a.jsonl", ["same", "other", "same"])
    run = RunDir(tmp_path / "data" / "dups")
    with ScriptedServer(script=script, default_script=[thinking("ok")]) as srv:
        first = run_cli(["--dataset_file=a.jsonl", *args], tmp_path, srv)
        assert_clean_exit(first, code=3)
        assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter({"same": 1, "other": 1})

        # The same prompts, reordered, with two more copies of "same" and one new prompt.
        write_dataset(tmp_path / "b.jsonl", ["new", "same", "same", "other", "same", "same"])
        since = len(srv.requests())
        second = run_cli(["--dataset_file=b.jsonl", *args, "--resume"], tmp_path, srv)
        assert_clean_exit(second)
        assert first_turn_prompts(srv, since) == Counter({"same": 3, "new": 1})

    assert Counter(prompt_of_record(r) for r in run.trajectories()) == Counter({"same": 4, "other": 1, "new": 1})
    assert run.stats()["prompts"] == {"total": 6, "done": 6, "discarded": 0, "failed": 0, "not_run": 0}


@pytest.mark.slow
def test_kill_9_mid_run_then_resume_gives_every_prompt_exactly_once(tmp_path):
    dataset = [f"task {i:02d}" for i in range(24)] + ["task 03", "task 07"]
    # Every fifth prompt has no reasoning, so discarded.jsonl is written too.
    script = {p: [NO_REASONING | {"latency": 0.4}] for p in dataset[::5]}
    write_dataset(tmp_path / "ds.jsonl", dataset)
    args = ["--dataset_file=ds.jsonl", "--batch_size=3", "--run_name=killed", "--num_workers=2", "--concurrency=4"]
    run = RunDir(tmp_path / "data" / "killed")
    with ScriptedServer(script=script, default_script=[thinking("ok", latency=0.4)]) as srv:
        proc = start_cli(args, tmp_path, srv)
        checkpoints = 0
        try:
            deadline = time.monotonic() + 120
            while len(run.batch_records()) + len(run.discarded()) < 8:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the run made no progress"
                checkpoints += read_checkpoint(run)
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the runner and every worker, at once
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        assert checkpoints, "checkpoint.json was never written during the run"
        finished = Counter(prompt_of_record(r) for r in run.batch_records() + run.discarded())
        unfinished = [p for p in dict.fromkeys(dataset) if p not in finished]
        assert len(unfinished) >= 2, "the kill came too late to test anything"

        # Torn last lines, as a kill in the middle of a write leaves them, naming prompts not finished yet.
        last_batch = run.path / f"batch_{run.batch_numbers()[-1]}.jsonl"
        with open(last_batch, "ab") as f:
            f.write(
                b'{"prompt_index": 1, "conversations": [{"from": "human", "value": "%s"}, {"fro'
                % unfinished[0].encode()
            )
        with open(run.path / "discarded.jsonl", "ab") as f:
            f.write(b'{"prompt_index": 2, "conversations": [{"from": "human", "value": "%s"' % unfinished[1].encode())

        since = len(srv.requests())
        resumed = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(resumed)
        rerun = first_turn_prompts(srv, since)

    assert outcome_counts(run) == Counter(dataset)
    # Exactly the prompts without a complete line ran again (those in flight at the kill included).
    assert rerun == Counter(dataset) - finished
    stats = run.stats()
    assert stats["prompts"]["done"] + stats["prompts"]["discarded"] == len(dataset)
    assert stats["merge"]["filtered_not_json"] == 1  # the torn batch line, never a trajectory
    assert read_checkpoint(run) and run.json("checkpoint.json")["state"] == "finished"


def read_checkpoint(run: RunDir) -> int:
    """1 if checkpoint.json exists (and then it must parse: it is replaced atomically), else 0."""
    try:
        text = (run.path / "checkpoint.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0
    doc = json.loads(text)
    assert doc["run_name"] and doc["total_prompts"], doc
    return 1


@pytest.mark.slow
def test_ctrl_c_lets_running_prompts_finish_then_resume_completes(tmp_path):
    dataset = [f"interrupt me {i}" for i in range(12)]
    write_dataset(tmp_path / "ds.jsonl", dataset)
    args = ["--dataset_file=ds.jsonl", "--batch_size=4", "--run_name=ctrlc", "--num_workers=1", "--concurrency=2"]
    run = RunDir(tmp_path / "data" / "ctrlc")
    with ScriptedServer(default_script=[thinking("ok", latency=1.0)]) as srv:
        proc = start_cli(args, tmp_path, srv)
        deadline = time.monotonic() + 120
        while not run.batch_records():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C reaches the whole foreground group
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr
        assert "Traceback" not in stderr and "--resume" in stderr
        assert run.failed() == [], "prompts running at Ctrl-C must finish, not fail"
        first = Counter(prompt_of_record(r) for r in run.batch_records())
        assert 0 < sum(first.values()) < len(dataset)
        assert run.json("checkpoint.json")["state"] == "interrupted"
        assert run.stats()["prompts"]["not_run"] == len(dataset) - sum(first.values())

        since = len(srv.requests())
        assert_clean_exit(run_cli([*args, "--resume"], tmp_path, srv))
        assert first_turn_prompts(srv, since) == Counter(dataset) - first
    assert outcome_counts(run) == Counter(dataset)
