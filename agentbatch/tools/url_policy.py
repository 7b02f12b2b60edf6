"""Which URLs the tools may fetch: http(s) only, and never private, loopback or otherwise non-public addresses.

A model that can make us fetch any URL could otherwise read cloud metadata (169.254.169.254), services on
the runner's host, or the intranet. Every hostname is resolved and every address it resolves to is checked;
fetchers should then connect to one of the checked addresses (see `resolve_url`), so a DNS answer that
changes between check and connect cannot slip a private address in.

Which non-public networks may be reached comes from the tool settings (`private_networks`: None for all,
else the networks BATCH_RUNNER_ALLOW_PRIVATE_URLS lists; --allow_private_urls allows all).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

ENV_VAR = "BATCH_RUNNER_ALLOW_PRIVATE_URLS"
_NAT64 = ipaddress.ip_network("64:ff9b::/96")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Networks = tuple[Network, ...] | None  # the non-public networks that may be reached; None: all of them


def check_url(url: str, allowed: Networks) -> None:
    """Raise ValueError (saying why) unless url is http(s) and its host resolves only to allowed addresses."""
    resolve_url(url, allowed)


def resolve_url(url: str, allowed: Networks) -> list[str]:
    """Check url as check_url does and return the addresses its host resolved to, all of them allowed."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ValueError(f"refusing {url!r}: only http and https URLs can be fetched")
    host = parts.hostname
    if not host:
        raise ValueError(f"refusing {url!r}: the URL has no host")
    try:
        port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError as e:
        raise ValueError(f"refusing {url!r}: {e}") from None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"cannot resolve host {host!r}: {e}") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise ValueError(f"cannot resolve host {host!r}: no addresses")
    for address in addresses:
        reason = blocked_reason(address, allowed)
        if reason:
            shown = host if host == address else f"{host} ({address})"
            raise ValueError(
                f"refusing {url!r}: {shown} is not a public address ({reason}); fetching such addresses is disabled "
                f"(allow it with --allow_private_urls or {ENV_VAR}=1)"
            )
    return addresses


def blocked_reason(address: str, allowed: Networks) -> str | None:
    """Why an address may not be fetched (e.g. "loopback"), or None when it may."""
    if allowed is None:
        return None
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone id
    for candidate in _embedded(ip):
        reason = _category(candidate)
        if reason and not any(candidate in net for net in allowed if net.version == candidate.version):
            return reason
    return None


def _embedded(ip: IPAddress) -> list[IPAddress]:
    """The address and any IPv4 address tunnelled inside it (mapped, 6to4, NAT64), each to be checked."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        return [ip.ipv4_mapped]  # the socket connects to exactly that IPv4 address
    out: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.sixtofour:
            out.append(ip.sixtofour)
        if ip in _NAT64:
            out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def _category(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:  # some multicast ranges count as "global"
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:  # shared (100.64/10), documentation, benchmarking and the like
        return "non-public"
    return None
