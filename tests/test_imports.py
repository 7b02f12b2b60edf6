"""The import graph stays as docs/architecture.md says: no cycle, lazy imports inside functions and imports by
name through importlib included, and the modules a trajectory is read with import nothing of the package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOUNDATIONS = ("trajectory", "toolset_distributions")  # readable without the package


def modules() -> dict[str, Path]:
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for path in (ROOT / "agentbatch").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours `path` imports, at its top or inside a function (a lazy import is an import too)."""
    out: set[str] = set()
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from package import module` imports the module, and runs the package's __init__ first: an edge to
            # both (a package whose __init__ imports its modules while they import it is a cycle, if a hidden one).
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out | imports_by_name(path, known)


def imports_by_name(path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours a file may import through importlib (`import_module(name)`, `__import__`): in a file that
    calls it, every string naming one of our modules (plugins.BUILTINS, the package's public names), and for an
    f-string `f"package.{...}"` every module of that package whose name is a string somewhere in our code."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    if not any(_imports_by_name(node) for node in ast.walk(tree)):
        return set()
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            out.add(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            head = str(node.values[0].value)
            if head.endswith("."):
                out |= {head + tail for tail in strings(known) if head + tail in known}
    return out


def _imports_by_name(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id in ("import_module", "__import__")
    )


_STRINGS: set[str] = set()


def strings(known: dict[str, Path]) -> set[str]:
    """Every string constant of our code (the names a module's name may be made of)."""
    if not _STRINGS:
        for path in known.values():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    _STRINGS.add(node.value)
    return _STRINGS


def test_no_module_is_part_of_an_import_cycle_lazy_imports_included():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    # A package's __init__ is imported before any module in it: that is no edge of ours to follow.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycle = stack[stack.index(other) :] + [other]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if other not in state:
                visit(other)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_the_trajectory_modules_import_nothing_of_the_package():
    known = modules()
    for name in FOUNDATIONS:
        ours = {m for m in imports(known[name], known) if m.startswith("agentbatch")}
        assert not ours, f"{name}.py imports {sorted(ours)}: a trajectory must be readable without the package"


# The core that runs every dataset: none of it names Harbor, which plugs in as any format does (docs/plugins.md).
CORE = ("agentbatch.sample_runner", "agentbatch.work", "agentbatch.dataset", "agentbatch.session", "agentbatch.launch")


def test_harbor_is_a_plug_in_the_core_never_names():
    from agentbatch import plugins

    known = modules()
    importers = sorted(
        name
        for name, path in known.items()
        if not name.startswith("agentbatch.harbor")
        and name != "agentbatch.plugins"  # its BUILTINS name the plug-ins it loads, Harbor's among them
        and any(m.startswith("agentbatch.harbor") for m in imports(path, known))
    )
    assert not importers, f"{importers} import agentbatch.harbor: only plugins.BUILTINS may name it"
    assert [m for m in plugins.BUILTINS if m.startswith("agentbatch.harbor")] == [
        "agentbatch.harbor.dataset_format",
        "agentbatch.harbor.oracle",
    ]
    for name in CORE:
        text = known[name].read_text(encoding="utf-8").lower()
        assert "harbor" not in text, f"{known[name].relative_to(ROOT)} names Harbor"


def test_imports_by_name_through_importlib_are_edges_of_the_graph():
    """What the loader, the package's public names and the export's formats import by name is seen, so a registry
    that loaded the plug-ins itself (the built-ins importing it back) is a cycle here."""
    known = modules()
    assert {"agentbatch.tools.terminal", "agentbatch.sandboxes.bwrap", "agentbatch.harbor.oracle"} <= imports(
        known["agentbatch.plugins"], known
    )
    assert {"agentbatch.tools.registry", "agentbatch.model.registry"} <= imports(known["agentbatch"], known)
    assert "agentbatch.export.openai_chat" in imports(known["agentbatch.export.run_export"], known)
