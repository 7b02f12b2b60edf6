"""A container's egress, controlled from the host (base.Egress): firewall rules in its network namespace.

They are set with `nsenter -t <its PID> -n iptables-restore` (and `ip6tables-restore`), the whole filter table
each time, so a switch replaces them, and they live and die with the namespace: nothing is left after a kill -9.
No process in the container can change them (it has no NET_ADMIN) or go around them (the container is made
without NET_RAW, so no raw socket skips netfilter). What they let out: loopback (the engine's DNS at 127.0.0.11
included), replies to connections made to the container, the sandbox's own services, and each allowed address;
everything else is refused at once (a TCP reset, an ICMP port unreachable), never left to time out.

A host name is resolved when the rules are set: on the sample's own networks (a service's name, which the
engine's DNS answers there), else by this machine's resolver, whose addresses are then pinned in the container's
/etc/hosts, so that its processes connect to the very addresses allowed. A rule is an address, not a name: two
names on one address are both let through.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field

from agentbatch.sandboxes.base import SandboxError, one_line

TOOLS = ("nsenter", "iptables-restore", "ip6tables-restore")
APPLY_TIMEOUT = 30.0
HOSTS_MARK = "# batch_runner egress"  # the lines of /etc/hosts that pin the allowed names end with it


@dataclass
class Rules:
    """What one policy lets out, resolved: IPv4 and IPv6 destinations, and the names pinned in /etc/hosts."""

    v4: list[str] = field(default_factory=list)
    v6: list[str] = field(default_factory=list)
    pins: list[tuple[str, str]] = field(default_factory=list)  # (address, name)
    open: bool = False  # anywhere: the filter table accepts everything


@functools.cache
def refusal() -> str | None:
    """Why egress cannot be controlled on this machine (None: it can). Asked before any sample starts."""
    if os.geteuid() != 0:
        return "the runner is not root, so it cannot set firewall rules in a container's network namespace"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian: apt-get install iptables util-linux)"
    host = os.environ.get("DOCKER_HOST", "")
    if host and not host.startswith("unix://"):
        return f"DOCKER_HOST={host} is not a local engine: its containers' network namespaces are not on this machine"
    from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

    try:
        options = client().info().get("SecurityOptions") or []
    except ENGINE_ERRORS as e:
        return f"the Docker engine does not say how it runs ({message(e)})"
    if any("rootless" in str(o) for o in options):
        return "the Docker engine is rootless: its containers' network namespaces are not the runner's to change"
    return None


def resolve(allowed: Iterable[str], local: dict[str, list[str]], own: Iterable[str] = ()) -> Rules:
    """The destinations of an allowlist: addresses and ranges as given, names from `local` (the sample's own
    networks: name -> addresses) else this machine's resolver (pinned); `own` (the sandbox's services) always.
    SandboxError naming a host that does not resolve."""
    rules = Rules()
    for address in own:
        _add(rules, ipaddress.ip_network(address, strict=False))
    for host in allowed:
        try:
            _add(rules, ipaddress.ip_network(host, strict=True))
            continue
        except ValueError:
            pass
        found = local.get(host.lower())
        if found:
            for address in found:
                _add(rules, ipaddress.ip_network(address, strict=False))
            continue
        for address in _lookup(host):
            _add(rules, ipaddress.ip_network(address, strict=False))
            rules.pins.append((address, host))
    return rules


def _lookup(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise SandboxError(f"allowed host {host!r} does not resolve: {e}") from None
    return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))


def _add(rules: Rules, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> None:
    target = rules.v4 if network.version == 4 else rules.v6
    text = network.compressed
    if text not in target:
        target.append(text)


def tables(rules: Rules) -> tuple[str, str]:
    """The iptables-restore and ip6tables-restore input of these rules: the whole filter table."""
    out = []
    for version, allowed in ((4, rules.v4), (6, rules.v6)):
        policy = "ACCEPT" if rules.open else "DROP"
        lines = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD DROP [0:0]", f":OUTPUT {policy} [0:0]"]
        if not rules.open:
            unreachable = "icmp-port-unreachable" if version == 4 else "icmp6-port-unreachable"
            lines += ["-A OUTPUT -o lo -j ACCEPT", "-A OUTPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT"]
            lines += [f"-A OUTPUT -d {address} -j ACCEPT" for address in allowed]
            lines += [
                "-A OUTPUT -p tcp -j REJECT --reject-with tcp-reset",
                f"-A OUTPUT -j REJECT --reject-with {unreachable}",
            ]
        out.append("\n".join([*lines, "COMMIT", ""]))
    return out[0], out[1]


def apply(pid: int, rules: Rules) -> None:
    """Set the rules in the network namespace of process `pid` (a container's PID 1); SandboxError if they cannot be."""
    if not pid:
        raise SandboxError("the container has no process: its egress cannot be controlled")
    v4, v6 = tables(rules)
    for command, text in (("iptables-restore", v4), ("ip6tables-restore", v6)):
        argv = ["nsenter", "-t", str(pid), "-n", command]
        try:
            done = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=APPLY_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SandboxError(f"cannot control the container's egress: {command}: {e}") from None
        if done.returncode != 0:
            raise SandboxError(f"cannot control the container's egress: {command}: {one_line(done.stderr, 300)}")


def hosts_file(current: str, pins: list[tuple[str, str]]) -> str:
    """/etc/hosts with the pinned names of the last policy replaced by these."""
    kept = [line for line in current.splitlines() if not line.endswith(HOSTS_MARK)]
    return "\n".join([*kept, *(f"{address}\t{name}\t{HOSTS_MARK}" for address, name in pins)]) + "\n"
