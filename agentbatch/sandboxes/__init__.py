"""Per-prompt sandboxes: the table of backends, the run's choice of one, and what a run asks of them.

Each backend is a module with `prepare`, `create` and `reap` (see base.Backend); it is imported when a
prompt first needs it, so a run of local sandboxes never loads the docker SDK.
"""

from __future__ import annotations

import importlib

from agentbatch.errors import FatalError
from agentbatch.sandboxes.base import Backend, Sandbox, SandboxSpec

BACKENDS = {
    "local": "agentbatch.sandboxes.local",
    "bwrap": "agentbatch.sandboxes.bwrap",
    "docker": "agentbatch.sandboxes.docker",
}
AUTO = "auto"
UNTRUSTED = "not an isolation boundary: commands run as your user and reach whatever it can"


def backend(kind: str) -> Backend:
    return importlib.import_module(BACKENDS[kind])


def choose(kind: str, network: bool = True) -> tuple[str, str]:
    """The run's sandbox and the one line that says which it is: `auto` is bwrap if it works here, else local.

    Probes bwrap once; FatalError when bwrap was asked for and does not work, or the network cannot be cut.
    """
    from agentbatch.sandboxes import bwrap, containment

    why_not = None
    if kind in (AUTO, "bwrap"):
        from agentbatch.sandboxes.base import SandboxSettings

        why_not = bwrap.probe(SandboxSettings(kind="bwrap", network=network))
        if why_not is None:
            user = "nobody" if bwrap.sandbox_user() else "your uid"
            net = "network on" if network else "no network"
            return "bwrap", (
                f"sandbox: bwrap (every command in its own namespaces as {user}, system directories read-only, {net})"
            )
        if kind == "bwrap":
            raise FatalError(
                f"--sandbox=bwrap: the bwrap sandbox does not work here: {why_not}; "
                "use --sandbox=local or --sandbox=docker"
            )
    if kind == "docker":
        return "docker", f"sandbox: docker ({'network on' if network else 'no network'})"
    because = f" (bwrap does not work here: {why_not})" if why_not else ""
    if not network:
        raise FatalError(
            f"--sandbox_network=none needs a sandbox that can cut the network, bwrap or docker{because}; "
            "use --sandbox=docker"
        )
    method = {"pidns": "a PID namespace", "cgroup": "a cgroup", "scan": "a /proc scan (weak)"}[containment.best()]
    other = "--sandbox=docker" if why_not else "--sandbox=bwrap or docker"
    return "local", (
        f"warning: sandbox: local{because}, {UNTRUSTED}; each command's processes are contained by {method}; "
        f"use {other} for models you do not trust"
    )


def prepare(spec: SandboxSpec) -> None:
    """Check, before any model call, that the prompt's sandbox can be made; raise SandboxError if not."""
    backend(spec.kind).prepare(spec)


def create(spec: SandboxSpec) -> Sandbox:
    """Make the prompt's sandbox; the caller must call cleanup() whatever happens."""
    return backend(spec.kind).create(spec)


def reap(kind: str, labels: dict[str, str]) -> int:
    """Remove every sandbox of this kind carrying all these labels; how many."""
    return backend(kind).reap(labels)
