"""Flag: one command-line flag's declaration, and the shorthands the flag tables (flag_tables/) are written with."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import agentbatch.flag_checks as check

Check = Callable[[str, Any], Any]


def _as_is(name: str, value: Any) -> Any:
    return value


def _text(name: str, value: Any) -> str | None:
    return None if value is None else str(value)


def optional(fn: Check) -> Check:
    """`fn`, except that None (the flag not given) stays None."""
    return lambda name, value: None if value is None else fn(name, value)


def integer(minimum: int, maximum: int = 2**31 - 1) -> Check:
    """A whole number from `minimum` to `maximum`."""
    return check.whole(minimum, maximum)


@dataclass(frozen=True)
class Flag:
    """One command-line flag. `text` flags keep their value exactly as typed (Fire would parse "123" as 123)."""

    name: str
    default: Any
    help: str
    check: Check = _as_is
    text: bool = False
    shown_default: str | None = None  # how the README shows the default, when not the literal value
    kind: type | None = None  # the value's type for --help, when neither `text` nor the default tells it
    # Where its checked value goes in the typed settings (settings.py): `Settings.<group>.<field>`, the field named
    # as the flag unless `field` says otherwise. tests/test_settings.py holds every flag to exactly one field.
    group: str = ""
    field: str | None = None

    @property
    def attribute(self) -> str:
        """Its field's name in its group of the settings."""
        return self.field or self.name

    def annotation(self) -> Any:
        kind = str if self.text else self.kind or type(self.default)
        return kind | None if self.default is None else kind

    def readme_default(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "none"
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


def text_flag(
    name: str,
    default: Any,
    help: str,
    check: Check = _text,
    shown: str | None = None,
    group: str = "",
    field: str | None = None,
) -> Flag:
    """A flag whose value is kept as typed (a string, or None)."""
    return Flag(name, default, help, check, text=True, shown_default=shown, group=group, field=field)
