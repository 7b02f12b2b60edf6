"""A row's identity is its whole task (issue 26 item 3): two rows with one prompt text and different setup or
checks are two rows to --resume, after a clean end and after kill -9; lines written before identities still
match by their prompt text (README, "Resume")."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

from cli_helpers import RunDir, assert_clean_exit, first_turn_prompts, run_cli, start_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from agentbatch.dataset import Entry
from agentbatch.export.common import RunSource
from agentbatch.run_dir.answers import answer_key, last_words, prompt_key, remaining
from agentbatch.run_dir.record_shape import trajectory_problem

PROMPT = "Make the tests in tests/ pass."  # the README's own prompt, in two rows
ARGS = ["--batch_size=5", "--distribution=terminal_only", "--sandbox=local", "--max_retries=0"]


def rows(marker: Path) -> list[dict]:
    """Row 0's setup fails until `marker` exists (its task does not change: the same setup command); row 1 runs."""
    return [
        {"prompt": PROMPT, "setup": f"test -f {marker} || exit 4", "verify": "true"},
        {"prompt": PROMPT, "setup": "mkdir -p tests", "verify": "test -d tests"},
    ]


def indexes(lines: list[dict]) -> Counter:
    return Counter(line["prompt_index"] for line in lines)


def test_two_rows_with_one_prompt_text_resume_as_two_rows(tmp_path):
    marker = tmp_path / "repo-ready"
    write_dataset(tmp_path / "ds.jsonl", rows(marker))
    run = RunDir(tmp_path / "data" / "twins")
    args = ["--dataset_file=ds.jsonl", "--run_name=twins", *ARGS]
    with ScriptedServer(default_script=[thinking("done")]) as srv:
        assert_clean_exit(run_cli(args, tmp_path, srv), 3)
        assert indexes(run.trajectories()) == {1: 1} and indexes(run.failed()) == {0: 1}
        stats = run.stats()["prompts"]
        assert (stats["done"], stats["failed"]) == (1, 1)
        identities = {line["prompt_index"]: line["identity"] for line in run.trajectories() + run.failed()}
        assert identities[0] and identities[1] and identities[0] != identities[1]

        marker.touch()
        resumed = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(resumed)
        assert "1 already done, 1 to run" in resumed.stderr
        # Row 0 ran (its setup now works), row 1 did not run again.
        assert first_turn_prompts(srv) == {PROMPT: 2}
    assert indexes(run.trajectories()) == {0: 1, 1: 1}
    stats = run.stats()["prompts"]
    assert (stats["done"], stats["failed"], stats["not_run"]) == (2, 0, 0)


def test_after_kill_9_the_failed_twin_is_not_skipped(tmp_path):
    marker = tmp_path / "repo-ready"
    slow = "a prompt still running when the session is killed"
    write_dataset(tmp_path / "ds.jsonl", [*rows(marker), slow])
    run = RunDir(tmp_path / "data" / "twins")
    args = ["--dataset_file=ds.jsonl", "--run_name=twins", *ARGS, "--concurrency=3"]
    script = {slow: [thinking("late", latency=4.0)]}
    with ScriptedServer(script=script, default_script=[thinking("done")]) as srv:
        proc = start_cli(args, tmp_path, srv)
        deadline = time.monotonic() + 60
        while not (run.batch_records() and run.failed()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        assert indexes(run.batch_records()) == {1: 1} and indexes(run.failed()) == {0: 1}

        marker.touch()
        assert_clean_exit(run_cli([*args, "--resume"], tmp_path, srv))
    assert indexes(run.trajectories()) == {0: 1, 1: 1, 2: 1}
    assert run.stats()["prompts"]["done"] == 3


def test_lines_written_before_identities_still_match_by_prompt_text(tmp_path):
    write_dataset(tmp_path / "ds.jsonl", ["a", "b", "a"])
    run = RunDir(tmp_path / "data" / "old")
    args = ["--dataset_file=ds.jsonl", "--run_name=old", *ARGS]
    with ScriptedServer(default_script=[thinking("done")]) as srv:
        assert_clean_exit(run_cli(args, tmp_path, srv))
        # As an older version wrote them: no identity on any line.
        for path in run.path.glob("batch_*.jsonl"):
            lines = [json.loads(line) for line in path.read_text().splitlines()]
            assert all(line.pop("identity") for line in lines)
            path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        asked = len(srv.requests())
        again = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(again)
        assert "3 already done, 0 to run" in again.stderr and len(srv.requests()) == asked
        assert run.stats()["prompts"]["done"] == 3

        # One old line of "a" gone: exactly one "a" runs again (duplicates count by occurrence, as before).
        batch = next(run.path.glob("batch_*.jsonl"))
        kept = [line for line in batch.read_text().splitlines(keepends=True)]
        drop = next(i for i, line in enumerate(kept) if json.loads(line)["prompt_index"] == 2)
        batch.write_text("".join(kept[:drop] + kept[drop + 1 :]))
        third = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(third)
        assert "2 already done, 1 to run" in third.stderr
        assert first_turn_prompts(srv, since=asked) == {"a": 1}
    assert Counter(line["conversations"][0]["value"] for line in run.trajectories()) == {"a": 2, "b": 1}


def test_matching_takes_a_rows_identity_first_then_older_lines_of_its_text():
    twins = [Entry(1, PROMPT, setup="x"), Entry(2, PROMPT, setup="y"), Entry(3, PROMPT, setup="y")]
    assert twins[0].identity != twins[1].identity == twins[2].identity
    done = Counter({(twins[1].identity, 0): 1})  # row 1 (or 2: the same task) answered
    assert [i for i, _, _ in remaining(twins, 1, done)] == [0, 2]
    old = Counter({(prompt_key(PROMPT), 0): 2})  # two lines of an older version: by text, in dataset order
    assert [i for i, _, _ in remaining(twins, 1, old)] == [2]
    mixed = Counter({(twins[2].identity, 0): 1, (prompt_key(PROMPT), 0): 1})
    assert [i for i, _, _ in remaining(twins, 1, mixed)] == [2]
    failed = Counter({(twins[0].identity, 0): 1})
    assert last_words(twins, 1, Counter({(twins[1].identity, 0): 1}), Counter(), failed) == {
        "total": 3,
        "done": 1,
        "discarded": 0,
        "failed": 1,
        "not_run": 1,
    }
    assert answer_key({"identity": "", "prompt": PROMPT}) == (prompt_key(PROMPT), 0)  # the neutral default
    assert answer_key({"identity": 5, "prompt": PROMPT, "sample_index": 2}) == (prompt_key(PROMPT), 2)
    # A trajectory whose identity is not text (a hand edit) is not a trajectory: dropped and counted, as others.
    turns = [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": "done"}]
    assert trajectory_problem({"conversations": turns, "identity": 5}) == "identity is not a string"


def test_the_export_shows_a_failed_row_whose_twin_was_answered(tmp_path):
    twins = [Entry(1, PROMPT, setup="x"), Entry(2, PROMPT, setup="y")]
    turns = [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": "done"}]
    answered = {"prompt_index": 1, "identity": twins[1].identity, "conversations": turns}
    failure = {"prompt_index": 0, "identity": twins[0].identity, "prompt": PROMPT, "error": "setup failed"}
    older = {"prompt_index": 0, "prompt": PROMPT, "error": "an older version's line: answered by the text"}
    (tmp_path / "batch_0.jsonl").write_text(json.dumps(answered) + "\n")
    (tmp_path / "failed.jsonl").write_text(json.dumps(failure) + "\n" + json.dumps(older) + "\n")
    (unanswered,) = RunSource(tmp_path).unanswered_failures()
    assert unanswered["error"] == "setup failed" and unanswered["attempts"] == 1
