"""A docker sandbox's networks: one of a container's own, the address a host has there, its egress set.

The egress rules themselves (what they let out, how they are set) are docker_egress.py's; this module finds what
they need of the engine: the container's PID, the sample's own services and their names, and pins the allowed
names the machine resolved in the container's /etc/hosts, so that its processes connect to the very addresses
the rules let through.
"""

from __future__ import annotations

from agentbatch.sandboxes import docker_egress
from agentbatch.sandboxes.base import SandboxError
from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

HOSTS = "/etc/hosts"


def own_network(name: str, labels: dict[str, str]) -> str:
    """A bridge network for one container alone (Resources.own_network), labelled as it is, so the reap finds it."""
    try:
        client().api.create_network(name, driver="bridge", labels=labels)
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot create a network for the container: {message(e)}") from e
    return name


def set_egress(sandbox, allowed: tuple[str, ...] | None) -> None:
    """The sandbox's container (a DockerSandbox) lets its processes connect to `allowed` alone (None: anywhere)."""
    if allowed is None:
        rules = docker_egress.Rules(open=True)
    else:
        rules = docker_egress.resolve(allowed, local_names(sandbox), own_addresses(sandbox))
    try:
        current = sandbox.read_file(HOSTS).decode("utf-8", "replace")
    except OSError:
        current = ""
    pinned = docker_egress.hosts_file(current, rules.pins)
    if pinned != current:  # a bind mount: written in place, by a shell builtin
        done = sandbox._exec(["sh", "-c", f'printf "%s" "$1" > {HOSTS}', "sh", pinned], timeout=30, user="0")
        if done.exit_code != 0:
            raise SandboxError(f"cannot pin the allowed hosts in {HOSTS}: {done.output.strip()[:200]}")
    try:
        pid = client().api.inspect_container(sandbox.container_id)["State"]["Pid"]
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot control the container's egress: {message(e)}") from e
    docker_egress.apply(pid, rules)


def address_of(sandbox, host: str) -> str | None:
    """The address `host` has in the sandbox's network: localhost is its container, else a name of its own
    services; None if it has none there."""
    if host.lower() in ("localhost", "127.0.0.1", "::1", ""):
        try:
            settings = client().api.inspect_container(sandbox.container_id)["NetworkSettings"]
        except (ENGINE_ERRORS, KeyError, TypeError):
            return None
        found = [n.get("IPAddress") for n in (settings.get("Networks") or {}).values() if n.get("IPAddress")]
        return found[0] if found else settings.get("IPAddress") or None
    found = local_names(sandbox).get(host.lower())
    return found[0] if found else None


def local_names(sandbox) -> dict[str, list[str]]:
    """Names the engine's DNS answers on the container's networks, with their addresses there: a Compose
    project's services (ComposeSandbox.local_names); a lone container has none."""
    names = getattr(sandbox, "local_names", None)
    return names() if names is not None else {}


def own_addresses(sandbox) -> list[str]:
    """The addresses of the sandbox's own services, reachable whatever its egress (ComposeSandbox.own_addresses)."""
    own = getattr(sandbox, "own_addresses", None)
    return own() if own is not None else []


def stop(container_id: str | None) -> None:
    """Stop a container at once (its processes killed), keeping it; never raises."""
    if container_id:
        try:
            client().api.stop(container_id, timeout=0)
        except ENGINE_ERRORS:
            pass  # gone already: its cleanup says nothing either
