"""The sandbox backends by name: importing a backend's module registers it (`@backend("name")`).

A new kind of sandbox is one module with one registered class (docs/sandboxes.md), imported by the
plug-in loader (agentbatch/plugins.py) as the built-ins are; `--sandbox` accepts exactly the registered
names, and a sample's sandbox comes from `get(spec.kind)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from agentbatch import plugins
from agentbatch.sandboxes.base import Backend

_classes: dict[str, type[Backend]] = {}
_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def backend(name: str) -> Callable[[type[Backend]], type[Backend]]:
    """Register the decorated Backend subclass as the sandbox kind `name` (a second class for a name is an error)."""

    def register(cls: type[Backend]) -> type[Backend]:
        if not (isinstance(cls, type) and issubclass(cls, Backend)):
            raise TypeError(f"sandbox backend {name!r}: {cls!r} is not a subclass of agentbatch.sandboxes.base.Backend")
        known = _classes.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"sandbox backend {name!r} is registered twice: {known.__module__} and {cls.__module__}")
        cls.name = name
        with _lock:
            _classes[name] = cls
            _instances.pop(name, None)  # a module imported again replaces its class
        return cls

    return register


def names() -> tuple[str, ...]:
    """Every registered kind: the built-ins in the loader's order, then the plug-ins' as they registered."""
    plugins.load()
    order = {module: i for i, module in enumerate(plugins.BUILTINS)}
    return tuple(sorted(_classes, key=lambda name: order.get(_classes[name].__module__, len(order))))


def get(name: str) -> Backend:
    """This process's instance of the backend `name`; KeyError if no module registered it."""
    plugins.load()
    with _lock:
        found = _instances.get(name)
        if found is None:
            found = _instances[name] = _classes[name]()
        return found
