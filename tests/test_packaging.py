"""The installed package must carry every module: an editable install maps only the listed ones."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_top_level_module_is_listed_in_py_modules():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["py-modules"])
    present = {p.stem for p in ROOT.glob("*.py")}
    assert present - listed == set(), "add these to [tool.setuptools] py-modules"
    assert listed - present == set(), "these are listed but do not exist"
