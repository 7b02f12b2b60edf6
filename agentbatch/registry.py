"""The one registry type: what plugs in, by name (tools, sandbox backends, dataset formats, models).

Each kind has one `Registry`, beside its decorator (`@tool` in tools/registry.py, `@registry.backend` in
sandboxes/registry.py, `@dataset_format` in dataset_formats.py, `@register_model` in model/registry.py),
filled when agentbatch/plugins.py imports the modules that declare them. One rule for a name given twice:
two different declarations are an error naming both; the same declaration again (its module imported once
more) replaces the first. A registry never loads the plug-ins itself (the loader imports the modules that
import the registries: loading from here would be an import cycle, through importlib): it is read once
`plugins.load` has run, and reading it before says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistrationError(ValueError):
    """A name is declared twice, by two different declarations."""


class NotLoaded(RuntimeError):
    """A registry was read before the plug-ins were loaded."""


@dataclass(frozen=True)
class Registered(Generic[T]):
    """What a name stands for, and who declared it (a module and qualified name, or e.g. an MCP server)."""

    name: str
    item: T
    origin: str


# (the name, the declaration there already, the new one) -> the error to raise
Clash = Callable[[str, Registered, Registered], Exception]
_loading = threading.Event()  # set by plugins.load as it starts (a plug-in may read a registry while imported)


class Registry(Generic[T]):
    """Things of one kind by name, in the order they were first registered (the built-ins first)."""

    def __init__(self, kind: str, clash: Clash | None = None, check: Callable[[T], None] | None = None):
        self.kind = kind
        self._clash = clash or self._registered_twice
        self._check = check  # raises if the item cannot be registered (run after the clash rule)
        self._items: dict[str, Registered[T]] = {}
        self._lock = threading.Lock()

    def add(self, name: str, item: T, origin: str) -> None:
        """Register `item` as `name`; the error of `clash` if another declaration has the name already."""
        new = Registered(name, item, origin)
        with self._lock:
            known = self._items.get(name)
            if known is not None and known.origin != origin:
                raise self._clash(name, known, new)
            if self._check is not None:
                self._check(item)
            self._items[name] = new

    def get(self, name: str) -> T | None:
        self._require_loading()
        found = self._items.get(name)
        return None if found is None else found.item

    def names(self) -> tuple[str, ...]:
        return tuple(self._read())

    def items(self) -> dict[str, T]:
        return {name: r.item for name, r in self._read().items()}

    def _read(self) -> dict[str, Registered[T]]:
        self._require_loading()
        with self._lock:
            return dict(self._items)

    def _require_loading(self) -> None:
        if not _loading.is_set():
            raise NotLoaded(f"the {self.kind}s are read before the plug-ins are loaded: call agentbatch.plugins.load()")

    def _registered_twice(self, name: str, known: Registered, new: Registered) -> Exception:
        return RegistrationError(f"{self.kind} {name!r} is registered twice: by {known.origin} and {new.origin}")


def loading() -> None:
    """Said by plugins.load as it starts importing: the registries may be read from now on."""
    _loading.set()


def origin_of(declared: object) -> str:
    """Who declared a function or class: its module and qualified name (the same declaration imported again
    has the same one)."""
    return f"{getattr(declared, '__module__', '?')}.{getattr(declared, '__qualname__', '?')}"
