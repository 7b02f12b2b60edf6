"""The rules for numbers an endpoint sends: token counts, costs, seconds to wait, log probabilities.

Each number is read once, where it arrives, through one of these, and comes out as a finite value in its
range or as None (not sent, or not a number of its kind). What arrives is anything JSON or a header can
carry: an int of hundreds of digits (float() of it overflows), NaN and Infinity (Python's json reads them),
a bool, a string of digits in any script ("²".isdigit() is true, int("²") fails).
"""

from __future__ import annotations

import math
import re
from typing import Any

# One call's tokens or cost beyond these is no real call's: a number past them is not a count or a cost (a sum
# of such values would reach Infinity, which JSON cannot write, or overflow an int64 column of the export).
MAX_COUNT = 10**12
MAX_USD = 10**9
# The longest wait a header can ask for; a caller caps it further (the retry delay, the pacer's pause).
MAX_WAIT_SECONDS = 86_400.0

_DIGITS = re.compile(r"[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def real(value: Any) -> float | None:
    """A finite number (a JSON int or float, never a bool) as a float; None otherwise."""
    if type(value) is float:  # the usual case first
        return value if math.isfinite(value) else None
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # an int past float's range
            return None
    return None


def count(value: Any) -> int | None:
    """A token count: a whole number 0..MAX_COUNT, sent as an int, a whole float, or a string of ASCII digits."""
    if type(value) is int:
        return value if 0 <= value <= MAX_COUNT else None
    if type(value) is str:
        text = value.strip()
        return int(text) if _DIGITS.fullmatch(text) and len(text) <= 13 and int(text) <= MAX_COUNT else None
    number = real(value)
    if number is None or not number.is_integer() or not 0 <= number <= MAX_COUNT:
        return None
    return int(number)


def usd(value: Any) -> float | None:
    """A cost in USD: a number 0..MAX_USD, sent as a number or a decimal string of ASCII digits."""
    if type(value) is str:
        text = value.strip()
        value = float(text) if _DECIMAL.fullmatch(text) else None
    number = real(value)
    return number if number is not None and 0 <= number <= MAX_USD else None


def seconds(text: Any, unit: float = 1.0) -> float | None:
    """A header's wait (ASCII decimal, in `unit` seconds) in seconds: below 0 is 0, above MAX_WAIT_SECONDS is
    that; None if it is not a number."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if not _DECIMAL.fullmatch(text):
        return None
    value = float(text) * unit  # "1e999" is inf, and 400 digits too: a huge wait, capped below
    return min(max(value, 0.0), MAX_WAIT_SECONDS)
