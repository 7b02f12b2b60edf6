"""--distributions_file: distributions of a JSON or YAML file beside the built-ins, checked at start."""

from __future__ import annotations

import json

import pytest

from toolset_distributions import (
    DISTRIBUTIONS,
    TOOLSETS,
    DistributionError,
    check_toolsets,
    format_distributions,
    get_distribution,
    prompt_rng,
    sample_toolsets,
    with_file,
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_json_file_adds_distributions_and_replaces_a_built_in(tmp_path):
    path = write(
        tmp_path,
        "dists.json",
        json.dumps(
            {
                "orders": {"description": "Order lookups,  mostly.", "toolsets": {"acme": 90, "web": 30}},
                "minimal": {"terminal": 100},
                "never_web": {"web": 0, "acme": 100},
            }
        ),
    )
    table = with_file(path)
    assert list(table)[: len(DISTRIBUTIONS)] == list(DISTRIBUTIONS)  # built-ins first, in their order
    orders = table["orders"]
    assert orders.description == "Order lookups, mostly." and orders.source == path
    assert orders.probabilities == {"acme": 90, "web": 30}
    assert orders.order() == ["web", "acme"]  # built-ins drawn first, then the file's own, as listed
    assert table["minimal"].probabilities == {"terminal": 100} and DISTRIBUTIONS["minimal"].probabilities == {
        "web": 100
    }
    assert table["never_web"].probabilities == {"acme": 100}
    assert get_distribution("orders", table) is orders
    text = format_distributions(table)
    assert f"orders: Order lookups, mostly. (from {path})\n    acme 90%, web 30%" in text
    assert f"minimal: (from {path})\n    terminal 100%" in text


def test_a_yaml_file_and_its_percent_fractions(tmp_path):
    path = write(tmp_path, "dists.yaml", "mine:\n  toolsets:\n    time: 12.5\n    file: 100\n")
    mine = with_file(path)["mine"]
    assert mine.probabilities == {"time": 12.5, "file": 100}
    draws = [sample_toolsets(mine, prompt_rng(3, i)) for i in range(4000)]
    assert all(d[0] == "file" for d in draws)  # drawn first: a built-in
    assert 0.09 < sum("time" in d for d in draws) / len(draws) < 0.16


def test_seeded_draws_of_a_built_in_distribution_are_what_they_were(tmp_path):
    path = write(tmp_path, "d.json", json.dumps({"copy": dict(DISTRIBUTIONS["science"].probabilities)}))
    copy = with_file(path)["copy"]
    for i in range(300):
        assert sample_toolsets(copy, prompt_rng(9, i)) == sample_toolsets(DISTRIBUTIONS["science"], prompt_rng(9, i))


@pytest.mark.parametrize(
    "name, text, says",
    [
        ("d.json", "{", "not JSON"),
        ("d.yaml", "a: [", "not JSON or YAML"),
        ("d.json", "[]", "expected an object of distributions"),
        ("d.json", "{}", "expected an object of distributions"),
        ("d.json", '{"a": 5}', "distribution 'a': expected toolsets with a percent each"),
        ("d.json", '{"a": {"web": 101}}', "distribution 'a': web: 101 is not a percent from 0 to 100"),
        ("d.json", '{"a": {"web": true}}', "web: True is not a percent"),
        ("d.json", '{"a": {"web": 0}}', "distribution 'a': every toolset is at 0%"),
        ("d.json", '{"a": {"toolsets": {"web": 5}, "description": 3}}', "description must be a string"),
        ("d.yaml", "a: &web {web: 5}\nb: *web\n", "line 2: YAML aliases (*web) are not accepted"),
        ("d.yaml", "b: &w {web: 5}\na:\n  <<: *w\n", "line 3: YAML aliases (*w)"),  # a merge key is an alias too
        ("d.yaml", f"a: {{web: {'1' * 5001}}}\n", "not JSON or YAML: a number has too many digits"),
        ("d.json", "[" * 100_000, "not JSON: nested too deeply"),
        ("d.json", json.dumps({"a": {"web": "w" * 100_000}}), "web: 'wwwwwwwwwwwwwwwww...wwwwwwwwwwwwwwwwww' is not"),
        ("d.json", json.dumps({"a": {"web": int("9" * 4000)}}), "web: a number of about 4000 digits is not"),
        ("d.json", json.dumps({"a": {"t" * 100_000: 500}}), "t" * 57 + "...: 500 is not a percent"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path, name, text, says):
    path = write(tmp_path, name, text)
    with pytest.raises(DistributionError) as e:
        with_file(path)
    assert str(e.value).startswith(f"--distributions_file {path}") and says in str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400  # a short excerpt of the value at fault


def test_a_missing_file_and_an_unknown_toolset(tmp_path):
    with pytest.raises(DistributionError, match="cannot read it: No such file"):
        with_file(str(tmp_path / "nope.json"))
    path = write(tmp_path, "d.json", json.dumps({"a": {"web": 10, "acme": 50}}))
    table = with_file(path)
    check_toolsets(table, [*TOOLSETS, "acme"])
    with pytest.raises(DistributionError) as e:
        check_toolsets(table, TOOLSETS)
    assert str(e.value) == (
        f"--distributions_file {path}: distribution 'a' names the toolset 'acme', which this run does not have; "
        f"its toolsets: {', '.join(TOOLSETS)}"
    )
