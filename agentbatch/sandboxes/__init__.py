"""Per-prompt sandboxes: the table of backends, and the three things a run asks of them.

Each backend is a module with `prepare`, `create` and `reap` (see base.Backend); it is imported when a
prompt first needs it, so a run of local sandboxes never loads the docker SDK.
"""

from __future__ import annotations

import importlib

from agentbatch.sandboxes.base import Backend, Sandbox, SandboxSpec

BACKENDS = {
    "local": "agentbatch.sandboxes.local",
    "docker": "agentbatch.sandboxes.docker",
}


def backend(kind: str) -> Backend:
    return importlib.import_module(BACKENDS[kind])


def prepare(spec: SandboxSpec) -> None:
    """Check, before any model call, that the prompt's sandbox can be made; raise SandboxError if not."""
    backend(spec.kind).prepare(spec)


def create(spec: SandboxSpec) -> Sandbox:
    """Make the prompt's sandbox; the caller must call cleanup() whatever happens."""
    return backend(spec.kind).create(spec)


def reap(kind: str, labels: dict[str, str]) -> int:
    """Remove every sandbox of this kind carrying all these labels; how many."""
    return backend(kind).reap(labels)
