"""Text from a dataset (a task's name, its category, a build's log) made safe to print on a terminal.

A control character (an ANSI or OSC escape's ESC, a carriage return, a bell, a newline inside a
one-line message) or another unprintable one (bidirectional overrides, say) is shown as its escape (`\\x1b`,
`\\u202e`), so what a task set wrote can neither move the cursor, retitle the window, hide text, nor make a
line look like another.
"""

from __future__ import annotations


def safe(text: str) -> str:
    """The text with every unprintable character written as its Python escape; printable text is unchanged."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
