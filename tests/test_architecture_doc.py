"""docs/architecture.md stays true: its layout block names every module of the package, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def layout_block() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Layout")
    block = re.search(r"```\n(.*?)```", text[start:], re.S)
    assert block, "docs/architecture.md has no layout block under '## Layout'"
    return block.group(1).splitlines()


def listed_paths() -> set[str]:
    """Every file the layout block names, as a path from the repository root (folders nest by indentation)."""
    paths: set[str] = set()
    folders: list[tuple[int, str]] = []  # (indentation, folder path) of the open folders
    for line in layout_block():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split()
        while folders and folders[-1][0] >= indent:
            folders.pop()
        base = folders[-1][1] if folders else ""
        for name in names:
            if name.endswith("/"):
                folders.append((indent, base + name))
            elif name.endswith(".py"):
                paths.add(base + name)
    return paths


def package_paths() -> set[str]:
    """The package's modules and the top-level ones; an empty __init__.py (a mere folder marker) is no module."""
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "agentbatch").rglob("*.py")
        if p.name != "__init__.py" or p.read_text(encoding="utf-8").strip()
    }
    top = {p.name for p in ROOT.glob("*.py")}
    return modules | top


def test_the_layout_block_lists_every_module_of_the_package_and_no_other():
    listed, present = listed_paths(), package_paths()
    assert not present - listed, f"modules missing from docs/architecture.md's layout: {sorted(present - listed)}"
    assert not listed - present, f"docs/architecture.md lists modules that do not exist: {sorted(listed - present)}"
