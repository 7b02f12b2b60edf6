"""The rules behind a check's result: pass@k against brute force, the answer rule, the reward line, bad rows."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from agentbatch.dataset_jsonl import load_entries
from agentbatch.outcome_stats import OutcomeStats, format_outcomes, pass_at_k, shown_ks
from agentbatch.verification import answer_matches, parse_reward


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_chance_that_k_of_the_n_samples_hold_a_pass(n):
    # Brute force: every way of picking k of the n samples, counting the picks that hold at least one pass.
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            picks = list(itertools.combinations(outcomes, k))
            assert pass_at_k(n, c, k) == pytest.approx(sum(any(p) for p in picks) / len(picks), abs=1e-12)


def test_pass_at_k_stays_exact_where_binomials_would_overflow_a_float():
    n, c, k = 2000, 3, 500
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # Python integers: exact
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_the_summary_shows_pass_at_one_powers_of_two_and_the_largest_k():
    assert shown_ks({str(k): 0.0 for k in range(1, 11)}) == ["1", "2", "4", "8", "10"]
    assert shown_ks({"1": 0.5}) == ["1"]


def line(task: str, status: str, category: str | None = None, difficulty: str | None = None) -> dict:
    """A Harbor task's trajectory line as far as the outcome figures read it."""
    reward = {"passed": 1.0, "failed": 0.0}.get(status)
    return {
        "prompt_index": hash(task) % 1000,
        "identity": task,
        "task": {"name": task, "category": category, "difficulty": difficulty, "tags": []},
        "check": {"status": status},
        "reward": reward,
        "passed": None if reward is None else reward == 1.0,
        "usage": {"total_tokens": 10},
        "toolsets_used": ["terminal"],
    }


def test_a_check_that_gave_no_result_counts_as_not_passed():
    # 12 passes and 9 checks the agent broke (rm -rf /logs; echo x > /logs): not 100%, but 12 of 21.
    stats = OutcomeStats()
    for i in range(12):
        stats.add(line(f"ok-{i}", "passed"))
    for i in range(9):
        stats.add(line(f"broken-{i}", "error"))
    o = stats.to_dict(1)
    assert (o["checked"], o["passed"], o["failed"], o["error"], o["pass_rate"]) == (21, 12, 0, 9, round(12 / 21, 4))
    assert (o["mean_reward"], o["pass_at_k"]["1"]) == (round(12 / 21, 4), round(12 / 21, 4))
    assert "12 passed, 0 not passed, 0 timed out, 9 could not run" in format_outcomes(o)[0]
    assert "pass rate 57.1%" in format_outcomes(o)[0]


def test_tasks_without_a_category_or_difficulty_have_a_row_of_their_own():
    stats = OutcomeStats()
    stats.add(line("a", "passed", "debugging", "easy"))
    for name in ("b", "c"):
        stats.add(line(name, "failed"))
    stats.add(line("d", "passed", difficulty="hard"))
    o = stats.to_dict(1)
    assert {k: (v["checked"], v["passed"]) for k, v in o["by_category"].items()} == {
        "debugging": (1, 1),
        "none": (3, 1),
    }
    assert {k: (v["checked"], v["passed"]) for k, v in o["by_difficulty"].items()} == {
        "easy": (1, 1),
        "hard": (1, 1),
        "none": (2, 0),
    }
    for key in ("by_category", "by_difficulty"):
        assert sum(v["checked"] for v in o[key].values()) == o["checked"] == 4
    table = format_outcomes(o)
    assert any(row.split()[:3] == ["none", "3", "1"] for row in table), table
    # A JSONL row's line has no task: no breakdown at all.
    rows = OutcomeStats()
    rows.add({**line("x", "passed"), "task": {"name": None, "category": None, "difficulty": None, "tags": []}})
    assert (rows.to_dict(1)["by_category"], rows.to_dict(1)["by_difficulty"]) == ({}, {})


@pytest.mark.parametrize(
    "expected, message, matches",
    [
        ("391", "17*23 = 391.", True),
        ("391", "It is 3910", False),
        ("391", "the answer: 391", True),
        ("Paris", "The capital of France is PARIS!", True),
        ("paris", "Parisian cafés", False),
        ("New  York", "new\nyork city", True),  # spacing and case do not count
        ("ﬁle", "the file is here", True),  # compatibility forms are the same text (NFKC)
        ("3.5", "13.5", False),
        ("-3", "x is -3", True),
        ("yes", "", False),
        ("Paris", "Not Paris, it is Lyon.", False),  # right after "not": not the answer
        ("Lyon", "Not Paris, it is Lyon.", True),
        ("sure", "I am not sure", False),
        ("x = 5", "x = 5.5", False),  # a phrase that ends in a digit does not end inside a longer number
        ("x = 5", "so x = 5.", True),
        ("391 apples", "-391 apples", False),
        ("391 apples", "3.391 apples", False),
        ("391 apples", "pages 100-391 apples", True),
    ],
)
def test_an_answer_matches_as_a_whole_word_or_phrase(expected, message, matches):
    assert answer_matches(expected, message) is matches


@pytest.mark.parametrize(
    "message, matches",
    [
        ("17*23 = 391.", True),
        ("The answer is 391", True),
        ("**391**", True),
        ("\\boxed{391}", True),
        ("391.0", True),  # the same value
        ("+391", True),
        ("-391", False),  # the sign is part of the number
        ("x = \u2212391", False),  # a typographic minus too
        ("391.5", False),  # so are the decimals
        ("3.391", False),
        ("391,000", False),  # and the thousands
        ("391,5", False),  # a decimal comma is not one number: it matches none
        ("version 3.391.1", False),
        ("It is 3910", False),
        ("391km", False),
        ("Not 391, it is 392", False),
        ("It isn't 391; it is 392", False),
        ("It is 392, not 391", False),
        ("Not 392: it is 391", True),  # another occurrence still counts
        ("pages 100-391", True),  # a dash after a digit is a range or a subtraction, not a sign
        ("391 is wrong, it is 392", True),  # what a word-level rule cannot read: see the README
    ],
)
def test_a_number_matches_a_whole_number_of_the_same_value(message, matches):
    assert answer_matches("391", message) is matches


@pytest.mark.parametrize(
    "expected, message, matches",
    [
        ("-3", "x = -3", True),
        ("-3", "5-3 = 2", False),  # a subtraction, not minus three
        ("0.5", "about .5", True),
        ("0.5", "0.50", True),
        ("0.5", "10.5", False),
        ("391,000", "391000 people", True),
        ("391,000", "391 people", False),
        ("1" + "0" * 5000, "it is 1" + "0" * 5000, True),  # no float overflows on the way
    ],
)
def test_numbers_compare_by_value(expected, message, matches):
    assert answer_matches(expected, message) is matches


@pytest.mark.parametrize(
    "output, reward",
    [
        ("0.5\n", 0.5),
        ('tests ran\n{"reward": 0.25, "passed": 1, "total": 4}\n\n', 0.25),
        ("1", 1.0),
        ('{"passed": 3}', None),  # no reward in the object: the exit status decides
        ("true", None),
        ("NaN", None),
        ("5 passed in 0.1s", None),
        ("", None),
        ('{"reward": "high"}', None),
        ("1" * 401, None),  # no float holds it: the exit status decides, not an internal error
        ('{"reward": 9' + "0" * 400 + "}", None),
        ("-" + "9" * 400, None),
        ("1e999", None),
        ("9" * 5000, None),  # past Python's digit limit for int()
        ("1e308", 1e308),
    ],
)
def test_the_reward_is_a_json_number_or_object_on_the_last_line(output, reward):
    assert parse_reward(output) == reward


def test_rows_with_unusable_checks_are_skipped_with_their_reason(tmp_path):
    rows = [
        {"prompt": "ok", "setup": "touch a", "verify": "test -f a", "answer": ["a", "b"]},
        {"prompt": "verify is a list", "verify": ["pytest"]},
        {"prompt": "empty setup", "setup": "  "},
        {"prompt": "answer is a number", "answer": 42},
        {"prompt": "empty answer list", "answer": []},
        {"prompt": "NUL in verify", "verify": "true\u0000"},
    ]
    path = tmp_path / "ds.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entries, warnings = load_entries(str(path))
    assert [(e.prompt, e.setup, e.verify, e.answers) for e in entries] == [("ok", "touch a", "test -f a", ("a", "b"))]
    assert [w.split(": skipped: ")[1] for w in warnings] == [
        '"verify" must be a non-empty shell command (a string)',
        '"setup" must be a non-empty shell command (a string)',
        '"answer" must be a non-empty string or a list of them',
        '"answer" must be a non-empty string or a list of them',
        '"verify" must be a non-empty shell command (a string)',
    ]
