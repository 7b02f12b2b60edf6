"""The command line to the CLI's keyword values, as Fire reads it, for the usual forms, without importing Fire.

Importing Fire (and asyncio, which it imports) was a third of the runner's start-up (bench/RESULTS.md). A
command line made only of known flags as `--name=value`, `--name value` or a lone `--name` is read here,
with Fire's rules: hyphens in a name are underscores, a lone flag is True, and a value is a Python literal
whose bare words are strings (`a,b` is a tuple of two strings, `1e3` a float, `true` the string "true"),
except for text flags, which keep their value exactly as typed (flags.quote_text_flags does that for Fire).
Anything else (help, a positional word, a repeated, negated, one-letter or unknown flag, a value starting
with "-") goes to Fire, which handles or reports it as always.
"""

from __future__ import annotations

import re
from typing import Any

from agentbatch.flags import BY_NAME

_INT = re.compile(r"0|[1-9][0-9]*")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONSTANTS = {"True": True, "False": False, "None": None}


def keyword_values(argv: list[str]) -> dict[str, Any] | None:
    """The flags' values as Fire would pass them to the CLI, or None when Fire itself must read the line."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            return None
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        flag = BY_NAME.get(name)
        if flag is None or name in values:
            return None
        if eq:
            values[name] = value if flag.text else literal(value)
        elif i + 1 == len(argv) or argv[i + 1].startswith("--"):
            values[name] = True  # a lone flag, as Fire reads it
        elif argv[i + 1].startswith("-"):
            return None  # Fire's own rules decide whether "-x" is a value or a flag
        else:
            i += 1
            values[name] = argv[i] if flag.text else literal(argv[i])
        i += 1
    return values


def literal(value: str) -> Any:
    """A value as Fire parses it: a Python literal in which bare words are strings; otherwise the text itself."""
    if _INT.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # past Python's 4300 digits: the text, which the flag's check then refuses
            return value
    if _WORD.fullmatch(value):
        return _CONSTANTS.get(value, value)
    import ast  # only for values beyond whole numbers and words

    try:
        tree = ast.parse(value, mode="eval")
    except (SyntaxError, ValueError):
        return value
    if isinstance(tree.body, ast.BinOp):  # "vendor/model-1.5" is a name, not a sum
        return value
    try:
        return ast.literal_eval(_bare_words(ast).visit(tree))
    except (SyntaxError, ValueError, TypeError):
        return value


def _bare_words(ast):
    """A transformer turning every name but True, False and None into the string it spells."""

    class BareWords(ast.NodeTransformer):
        def visit_Name(self, node):
            return node if node.id in _CONSTANTS else ast.Constant(node.id)

    return BareWords()
