"""No function of the package (nor of the top-level modules) is over 80 lines: a function that needs more is
several steps, each of which deserves a name (STYLE.md; the developers' guide)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80


def lengths(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(lines, where) of every function and method in `path`, nested ones included, decorators counted."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.append((node.end_lineno - first + 1, f"{path.relative_to(root)}:{node.lineno} {node.name}"))
    return out


def test_no_function_is_over_80_lines():
    files = [*ROOT.glob("*.py"), *(ROOT / "agentbatch").rglob("*.py")]
    long = sorted((n, where) for path in files for n, where in lengths(path) if n > MAX_LINES)
    assert not long, "functions over 80 lines (split them into named steps): " + "; ".join(
        f"{where} ({n} lines)" for n, where in long
    )


def test_the_measure_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "long.py").write_text(f"@decorator\ndef long():\n{body}\n", encoding="utf-8")
    assert lengths(tmp_path / "long.py", tmp_path) == [(MAX_LINES + 2, "long.py:2 long")]
