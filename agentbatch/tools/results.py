"""A tool's result as the endpoint is sent it: every text redacted, the whole cut to size, as JSON text.

The size rule (docs/tools.md, "Declaring a tool") holds whatever the result's shape, for built-in, Python
and MCP tools alike, since every call goes through call_tool: the texts of a result share
`max_output_chars` characters, wherever they are (a value, a list's item, a nested object's value). A text
over its share keeps its head and tail with the cut marked, as the terminal's output always did, and the
longest texts are cut first, so one short field beside a long one stays whole. A result that is long for
its many values rather than for its long texts (a list of a million numbers) cannot be cut that way: the
model gets the head and tail of its JSON text instead, under `output` (or `error`, if the call failed).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Below this many characters per text, cutting each text leaves nothing readable: the JSON text is cut instead.
MIN_SHARE = 200


def cap_output(text: str, limit: int) -> str:
    """Keep the head and the tail of an over-long text, marking what was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit} characters cut] ...\n{text[-tail:]}"


def result_text(result: Any, limit: int, redact: Callable[[str], str], ok: bool = True) -> str:
    """The result as JSON text, every text in it redacted (before any cut, so no prefix of a secret survives)
    and the whole capped to `limit` characters of text; TypeError, ValueError or RecursionError if it is not JSON.
    `ok`: whether the call succeeded, which names the key of a result cut as JSON text."""
    lengths: list[int] = []

    def clean(text: str) -> str:
        text = redact(text)
        lengths.append(len(text))
        return text

    result = _map_texts(result, clean)
    text = _dumps(result)
    if limit <= 0 or len(text) <= limit:
        return text
    share = _share(lengths, limit)
    if share is None or share >= MIN_SHARE:
        skeleton = _dumps(_map_texts(result, lambda _: ""))
        if len(skeleton) <= limit:  # its texts are what makes it long
            return text if share is None else _dumps(_map_texts(result, lambda t: cap_output(t, share)))
    return _dumps({"output" if ok else "error": cap_output(text, limit)})


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _map_texts(value: Any, f: Callable[[str], str]) -> Any:
    """The value with `f` applied to every string in it (not to an object's keys); lists for tuples."""
    if isinstance(value, str):
        return f(value)
    if isinstance(value, dict):
        return {k: _map_texts(v, f) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_texts(v, f) for v in value]
    return value  # a number, a bool, None; or what is not JSON, which json.dumps then names


def _share(lengths: list[int], limit: int) -> int | None:
    """The most characters each text may keep so that together they fit in `limit` (None: they fit already)."""
    remaining, count = limit, len(lengths)
    for i, length in enumerate(sorted(lengths)):
        fair = remaining // (count - i)
        if length > fair:
            return fair
        remaining -= length
    return None
