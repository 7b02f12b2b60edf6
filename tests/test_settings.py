"""The typed settings (agentbatch/settings.py): every flag is exactly one typed field, built one way, never changed."""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from pathlib import Path

import pytest

from agentbatch import flags, settings
from agentbatch.errors import FatalError

ROOT = Path(__file__).resolve().parents[1]


def fields_of(group: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(group)


def test_every_flag_is_exactly_one_field_of_its_group_and_every_field_one_flag():
    named: dict[tuple[str, str], str] = {}
    for f in flags.FLAGS:
        assert f.group in settings.GROUPS, (
            f"--{f.name} names no group of the settings: give it group= one of {sorted(settings.GROUPS)} in "
            "its table (agentbatch/flag_tables/<group>.py), and its group in agentbatch/settings.py a field of its "
            "value's type"
        )
        assert f.attribute in fields_of(settings.GROUPS[f.group]), (
            f"--{f.name}: {settings.GROUPS[f.group].__name__} has no field {f.attribute!r} (agentbatch/settings.py)"
        )
        assert (f.group, f.attribute) not in named, f"--{f.name} and --{named[f.group, f.attribute]} share a field"
        named[f.group, f.attribute] = f.name
    for group, cls in settings.GROUPS.items():
        for name in fields_of(cls):
            assert (group, name) in named, f"settings.{cls.__name__}.{name} is set by no flag"


def conforms(value: typing.Any, hint: typing.Any) -> bool:
    """Whether `value` is of the type `hint` says (the unions, tuples and lists the settings use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(v, args[0]) for v in value)
    if origin is list:
        return isinstance(value, list) and all(conforms(v, args[0]) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    if hint is float:
        return isinstance(value, float)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


# Values as the command line gives them (Fire and command_line make numbers of numbers), for flags whose default
# is None, so that each field's type is seen holding a value too.
GIVEN = {
    "dataset_file": "tests",
    "batch_size": 5,
    "run_name": "r",
    "tools": "a,b",
    "api_key": "sk-x",
    "max_tokens": 7,
    "max_tokens_per_prompt": 100,
    "max_cost_per_prompt": 0.5,
    "prompt_timeout": 30,
    "price_input": 1,
    "price_output": 2.5,
    "budget_usd": 3,
    "budget_tokens": 1000,
    "concurrency": 8,
    "sandbox_starts": 2,
    "max_samples": 3,
    "providers_allowed": "x,y",
    "providers_ignored": ("z",),
    "providers_order": "p",
    "provider_sort": "price",
    "reasoning_effort": "low",
    "ephemeral_system_prompt": "be brief",
    "seed": 4,
    "sandbox": "local",
    "sandbox_network": "none",
    "sandbox_memory": "2g",
    "ray_address": "auto",
    "vision_model": "v",
    "image_model": "i",
    "image_base_url": "http://127.0.0.1:9/v1",
    "moa_models": "m1,m2",
    "moa_aggregator": "agg",
    "local_model_path": "model.gguf",
    "export": "openai,parquet",
    "export_toolsets": "terminal",
    "plugins": "agentbatch.tools.terminal",
    "compare": "other",
    "cache_dir": "model-calls",
    "cache_expiry": "never",
}


@pytest.mark.parametrize("values", [{}, GIVEN], ids=["defaults", "given"])
def test_each_field_holds_its_flags_checked_value_with_its_declared_type(values):
    built, checked = settings.build(values), flags.parse(values)
    for f in flags.FLAGS:
        group = getattr(built, f.group)
        value = getattr(group, f.attribute)
        assert value == checked[f.name], f.name
        hint = fields_of(type(group))[f.attribute]
        assert conforms(value, hint), f"--{f.name}={value!r} is not a {hint}"
    assert built.given == frozenset(values)


def test_every_value_is_checked_by_its_flag_and_unknown_flags_are_refused():
    for name, bad in (("max_turns", 0), ("batch_size", "x"), ("docker_memory", "lots"), ("sandbox_network", "off")):
        with pytest.raises(FatalError, match=f"--{name}"):
            settings.build({name: bad})
    with pytest.raises(FatalError, match="unknown flag --max_turn;"):
        settings.build({"max_turn": 3})


def test_a_models_implied_values_stand_in_for_the_flags_not_given():
    oracle = settings.build({"model": "oracle"})
    assert (oracle.tools.distribution, oracle.quality.require_reasoning) == ("terminal_only", False)
    assert oracle.tools.command_timeout == 86400.0
    given = settings.build({"model": "oracle", "require_reasoning": "true", "distribution": "default"})
    assert (given.tools.distribution, given.quality.require_reasoning) == ("default", True)
    assert settings.build({}).tools.distribution == "default"  # an endpoint's model implies nothing


def test_settings_are_frozen_and_derived_with_replace():
    built = settings.build({"max_turns": 3})
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.limits.max_turns = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.limits = built.limits
    derived = dataclasses.replace(built, limits=dataclasses.replace(built.limits, max_turns=4))
    assert (built.limits.max_turns, derived.limits.max_turns) == (3, 4)
    assert "sk-secret" not in repr(settings.build({"api_key": "sk-secret"}))


def test_a_check_timeout_bounds_a_tasks_own_only_when_given():
    assert settings.build({}).timeout_bounds().check_timeout is None
    assert settings.build({"check_timeout": 300}).timeout_bounds().check_timeout == 300.0


def calls_of(path: Path, module: str, function: str) -> list[int]:
    """The lines of `path` that call `module.function` (as `module.function(...)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        f = node.func if isinstance(node, ast.Call) else None
        if isinstance(f, ast.Attribute) and f.attr == function and getattr(f.value, "id", None) == module:
            found.append(node.lineno)
    return found


def test_nothing_but_the_settings_reads_the_checked_flags():
    """flags.parse's dict (read by string keys) exists only inside settings.build; the CLI reads the raw values it
    needs before the build through flags' own helpers, never by a flag's name."""
    sources = [ROOT / "batch_runner.py", *(ROOT / "agentbatch").rglob("*.py")]
    parsing = {p.relative_to(ROOT).as_posix() for p in sources if calls_of(p, "flags", "parse")}
    assert parsing == {"agentbatch/settings.py"}
    names = {f.name for f in flags.FLAGS}
    cli = ast.parse((ROOT / "batch_runner.py").read_text(encoding="utf-8"))
    read = [
        node.lineno
        for node in ast.walk(cli)
        if isinstance(node, ast.Constant) and node.value in names  # a flag's name spelled in the CLI
    ]
    assert not read, f"batch_runner.py names flags by string at lines {read}: read them through agentbatch.flags"
