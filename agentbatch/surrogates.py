"""Lone surrogates out of every text that enters a record, each replaced with U+FFFD.

A Python str can hold a surrogate code point (U+D800-U+DFFF) on its own: an endpoint's JSON escape
"\\ud800" decodes to one, and so do bytes decoded with surrogateescape. UTF-8 cannot encode it, and a
file holding it as the escape "\\ud800" is refused by Arrow's JSON reader as a whole, so `datasets`
could load none of trajectories.jsonl. A real character outside the BMP is one code point in a str,
never a pair of surrogates, so every surrogate code point is a lone one.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
# In raw JSON bytes, what can decode to a surrogate: its escape (\uD800-\uDFFF, either case), or its
# three-byte UTF-8-like form, which json.loads lets through. The cheap test before a walk.
_ESCAPED = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


def scrub(text: str) -> str:
    """The text with every surrogate code point replaced by U+FFFD."""
    return _SURROGATE.sub(REPLACEMENT, text) if _SURROGATE.search(text) else text


def has_escaped_surrogate(raw: bytes) -> bool:
    """True if these JSON bytes may decode to a surrogate (an escape of one, or its raw UTF-8-like bytes)."""
    # Two substring tests (memchr-fast) spare the regex nearly every line: the merge reads gigabytes.
    if b"\\u" not in raw and b"\xed" not in raw:
        return False
    return bool(_ESCAPED.search(raw))


def scrub_json(value: Any) -> Any:
    """A parsed JSON value with every string (keys too) scrubbed; walks without recursion, however deep."""
    if isinstance(value, str):
        return scrub(value)
    if not isinstance(value, (dict, list)):
        return value
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    node[i] = scrub(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
        else:
            for key in list(node):
                item = node[key]
                if isinstance(key, str) and _SURROGATE.search(key):
                    del node[key]
                    key = scrub(key)
                    node[key] = item
                if isinstance(item, str):
                    node[key] = scrub(item)
                elif isinstance(item, (dict, list)):
                    stack.append(item)
    return value
