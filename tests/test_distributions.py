"""Toolset distributions: the table, sampling frequencies, the at-least-one fallback, seeded runs."""

from __future__ import annotations

import random

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, thinking, write_dataset
from scripted_server import ScriptedServer

from agentbatch.tools.registry import TOOLSETS
from toolset_distributions import (
    DISTRIBUTIONS,
    TOOLSET_ORDER,
    Distribution,
    UnknownDistribution,
    get_distribution,
    prompt_rng,
    sample_toolsets,
)

# The README's distribution table, copied cell by cell (None for "–"): web, vision, image_gen, terminal, file, moa, browser.
_ = None
TABLE = {
    "default": (100, 100, 100, 100, 100, 100, 100),
    "image_gen": (55, 90, 90, 45, _, 10, _),
    "research": (90, 50, _, 10, _, 40, 70),
    "science": (94, 65, 15, 94, 94, 10, 50),
    "development": (30, 10, _, 80, 80, 60, _),
    "safe": (80, 60, 60, _, _, 50, 70),
    "balanced": (50, 50, 50, 50, 50, 50, 50),
    "minimal": (100, _, _, _, _, _, _),
    "terminal_only": (_, _, _, 100, 100, _, _),
    "terminal_web": (100, _, _, 100, 100, _, _),
    "creative": (30, 90, 90, _, _, _, _),
    "reasoning": (30, _, _, 20, _, 90, _),
    "browser_use": (80, 70, _, _, _, _, 100),
    "browser_only": (_, _, _, _, _, _, 100),
    "browser_tasks": (_, 12, _, 15, _, _, 97),
    "terminal_tasks": (97, 50, 10, 97, 97, _, 75),
    "mixed_tasks": (35, 15, 15, 92, 92, _, 92),
}
# The toolset used when no flip comes up: the most probable, the first listed on ties.
FALLBACK = {
    "default": "web",
    "image_gen": "vision",
    "research": "web",
    "science": "web",
    "development": "terminal",
    "safe": "web",
    "balanced": "web",
    "minimal": "web",
    "terminal_only": "terminal",
    "terminal_web": "web",
    "creative": "vision",
    "reasoning": "moa",
    "browser_use": "browser",
    "browser_only": "browser",
    "browser_tasks": "browser",
    "terminal_tasks": "web",
    "mixed_tasks": "terminal",
}
DRAWS = 10_000


def spec_probabilities(name: str) -> dict[str, int]:
    return {ts: p for ts, p in zip(TOOLSET_ORDER, TABLE[name], strict=True) if p is not None}


def test_the_seventeen_distributions_match_the_spec_table():
    assert TOOLSET_ORDER == ("web", "vision", "image_gen", "terminal", "file", "moa", "browser")
    assert list(DISTRIBUTIONS) == list(TABLE)
    for name, dist in DISTRIBUTIONS.items():
        assert dist.name == name
        assert dist.probabilities == spec_probabilities(name), name
        assert dist.description.strip() and "\n" not in dist.description
    assert len({d.description for d in DISTRIBUTIONS.values()}) == 17


@pytest.mark.parametrize("name", list(TABLE))
def test_frequencies_over_10000_seeded_draws_are_within_two_points(name):
    dist = get_distribution(name)
    probs = spec_probabilities(name)
    counts = dict.fromkeys(TOOLSET_ORDER, 0)
    for i in range(DRAWS):
        chosen = sample_toolsets(dist, prompt_rng(1234, i))
        assert chosen, "every prompt gets at least one toolset"
        assert len(set(chosen)) == len(chosen)
        for ts in chosen:
            counts[ts] += 1
    # The fallback adds the chance that no flip came up to the most probable toolset.
    none_came_up = 1.0
    for p in probs.values():
        none_came_up *= 1 - p / 100
    for ts in TOOLSET_ORDER:
        expected = probs.get(ts, 0) / 100 + (none_came_up if ts == FALLBACK[name] else 0)
        observed = counts[ts] / DRAWS
        assert abs(observed - expected) <= 0.02, f"{name}/{ts}: {observed:.3f} vs {expected:.3f}"
        if ts not in probs:
            assert counts[ts] == 0


class _NothingComesUp(random.Random):
    """An RNG whose every flip fails, to force the fallback."""

    def random(self) -> float:
        return 0.999999


@pytest.mark.parametrize("name", list(TABLE))
def test_when_no_flip_comes_up_the_most_probable_toolset_is_used(name):
    dist = get_distribution(name)
    if all(p == 100 for p in dist.probabilities.values()):
        assert sample_toolsets(dist, _NothingComesUp()) == [t for t in TOOLSET_ORDER if t in dist.probabilities]
    else:
        assert sample_toolsets(dist, _NothingComesUp()) == [FALLBACK[name]]


def test_fallback_ties_go_to_the_first_listed_toolset():
    low = Distribution("low", "rarely anything", {"moa": 1, "vision": 1, "browser": 1})
    draws = [sample_toolsets(low, prompt_rng(5, i)) for i in range(DRAWS)]
    assert all(draws)
    fallbacks = [d for d in draws if d == ["vision"]]
    assert len(fallbacks) > DRAWS * 0.9  # 0.99**3 of the draws fall back, always to vision (listed before moa)
    assert sample_toolsets(low, _NothingComesUp()) == ["vision"]


def test_seeded_sampling_depends_only_on_seed_and_prompt_index():
    dist = get_distribution("balanced")
    a = [sample_toolsets(dist, prompt_rng(7, i)) for i in range(200)]
    b = [sample_toolsets(dist, prompt_rng(7, i)) for i in reversed(range(200))][::-1]
    assert a == b
    assert a != [sample_toolsets(dist, prompt_rng(8, i)) for i in range(200)]


def test_unknown_distribution_names_the_valid_ones():
    with pytest.raises(UnknownDistribution) as e:
        get_distribution("everything")
    assert "'everything'" in str(e.value) and "mixed_tasks" in str(e.value)


@pytest.mark.slow
def test_seeded_runs_sample_the_same_toolsets_whatever_the_workers(tmp_path):
    prompts = [f"seeded {i}" for i in range(12)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    dist = get_distribution("balanced")
    expected = {i: sample_toolsets(dist, prompt_rng(7, i)) for i in range(len(prompts))}
    base = ["--dataset_file=ds.jsonl", "--batch_size=5", "--distribution=balanced", "--seed=7"]
    runs = {}
    with ScriptedServer(default_script=[thinking("ok", latency=0.05)]) as srv:
        for name, workers in (("one", ["--num_workers=1"]), ("many", ["--num_workers=2", "--concurrency=5"])):
            since = len(srv.requests())
            assert_clean_exit(run_cli([*base, f"--run_name={name}", *workers], tmp_path, srv))
            runs[name] = {r["prompt_index"]: r for r in RunDir(tmp_path / "data" / name).trajectories()}
            offered = {
                b["messages"][0]["content"]: {t["function"]["name"] for t in b.get("tools", [])}
                for b in srv.requests()[since:]
            }
            for i, record in runs[name].items():
                assert prompt_of_record(record) == prompts[i]
                sampled = record["toolsets_used"]
                allowed = {t for ts in sampled for t in TOOLSETS[ts]}
                assert offered[prompts[i]] <= allowed, f"tools outside the sampled toolsets for prompt {i}"
                # terminal and file tools need nothing configured: offered exactly when sampled.
                assert ("terminal" in offered[prompts[i]]) == ("terminal" in sampled)
                assert ("read_file" in offered[prompts[i]]) == ("file" in sampled)

    for name, records in runs.items():
        assert {i: r["toolsets_used"] for i, r in records.items()} == expected, name
    assert len({tuple(ts) for ts in expected.values()}) > 3, "the seed should give varied toolsets"
