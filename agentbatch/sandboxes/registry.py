"""The sandbox backends by name: importing a backend's module registers it (`@backend("name")`).

A new kind of sandbox is one module with one registered class (docs/sandboxes.md), imported by the
plug-in loader (agentbatch/plugins.py) as the built-ins are, into the one Registry of backends (BACKENDS);
`--sandbox` accepts exactly the registered names, and a sample's sandbox comes from `get(spec.kind)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agentbatch.registry import Registry, origin_of
from agentbatch.sandboxes.base import Backend

BACKENDS: Registry[type[Backend]] = Registry("sandbox backend")
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Register the decorated Backend subclass as the sandbox kind `name` (a second class for a name is an error)."""

    def register(cls: type[Backend]) -> type[Backend]:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"sandbox backend {name!r}: {cls!r} is not a subclass of agentbatch.sandboxes.base.Backend")
        BACKENDS.add(name, cls, origin_of(cls))
        cls.name = name
        with _lock:
            _instances.pop(name, None)  # a module imported again replaces its class
        return cls

    return register


def names() -> tuple[str, ...]:
    """Every registered kind, in the order they registered: the built-ins in the loader's order, then plug-ins'."""
    return BACKENDS.names()


def get(name: str) -> Backend:
    """This process's instance of the backend `name`; KeyError if no module registered it."""
    with _lock:
        found = _instances.get(name)
        if found is None:
            cls = BACKENDS.get(name)
            if cls is None:
                raise KeyError(name)
            found = _instances[name] = cls()
        return found
