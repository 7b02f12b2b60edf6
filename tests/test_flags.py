"""Each flag is declared once (agentbatch/flag_tables/, in flags.ORDER); the CLI, --help and docs/flags.md follow from it."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import batch_runner
from agentbatch import flags
from agentbatch.errors import FatalError

ROOT = Path(__file__).resolve().parent.parent


def test_the_flag_reference_page_is_the_declared_flags():
    page = (ROOT / "docs" / "flags.md").read_text(encoding="utf-8")
    assert page == flags.reference_page(), "regenerate it: python -m agentbatch.flags > docs/flags.md"


def test_the_cli_signature_is_the_declared_flags():
    params = inspect.signature(batch_runner.main).parameters
    assert [p for p in params if p != "unknown"] == [f.name for f in flags.FLAGS]
    assert all(params[f.name].default == f.default for f in flags.FLAGS)


def test_help_shows_every_flag_with_its_help_text():
    done = subprocess.run(
        [sys.executable, str(ROOT / "batch_runner.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    for f in flags.FLAGS:
        assert f"--{f.name}" in done.stdout
        assert " ".join(f.help.split()[:4]) in " ".join(done.stdout.split()), f.name


def test_every_flag_is_checked_by_its_declaration():
    assert flags.parse({})["max_turns"] == 10
    for name, bad in (("max_turns", 0), ("batch_size", "x"), ("docker_memory", "lots"), ("provider_sort", "cheapest")):
        with pytest.raises(FatalError, match=f"--{name}"):
            flags.parse({name: bad})
    with pytest.raises(FatalError, match="unknown flag --max_turn;"):
        flags.parse({"max_turn": 3})


def test_text_flags_are_kept_as_typed():
    quoted = flags.quote_text_flags(["--model=123", "--run_name", "a, b", "--max_turns=3"])
    assert quoted == ["--model='123'", "--run_name", "'a, b'", "--max_turns=3"]


def test_implied_values_stand_in_for_defaults_and_a_flag_given_keeps_its_own():
    implied = {"distribution": "terminal_only", "require_reasoning": False, "command_timeout": 86400.0}
    f = flags.parse({"model": "oracle", "require_reasoning": "true"}, implied)
    assert (f["distribution"], f["require_reasoning"], f["command_timeout"]) == ("terminal_only", True, 86400.0)
    assert flags.parse({})["distribution"] == "default"  # nothing implied: the defaults
    with pytest.raises(FatalError, match="--no_such_flag is implied .* but is no flag"):
        flags.parse({}, {"no_such_flag": 1})


def test_each_flag_is_declared_in_the_table_of_its_group():
    for table in flags.TABLES:
        group = table.__name__.rpartition(".")[2]
        assert {f.group for f in table.FLAGS} == {group}, f"{table.__name__} declares a flag of another group"
    assert len(flags.FLAGS) == sum(len(table.FLAGS) for table in flags.TABLES)


def test_the_order_names_every_declared_flag_once():
    tables = tuple(table.FLAGS for table in flags.TABLES)
    assert [f.name for f in flags._in_order(tables, flags.ORDER)] == list(flags.ORDER)
    for order, wrong in (
        (flags.ORDER[:-1], "compare"),
        ((*flags.ORDER, "seed"), "seed"),
        ((*flags.ORDER, "nope"), "nope"),
    ):
        with pytest.raises(RuntimeError, match=f"flags.ORDER: \\['{wrong}'\\]"):
            flags._in_order(tables, order)
    with pytest.raises(RuntimeError, match="\\['port'\\]"):  # declared twice
        flags._in_order((*tables, tuple(f for f in flags.FLAGS if f.name == "port")), flags.ORDER)
