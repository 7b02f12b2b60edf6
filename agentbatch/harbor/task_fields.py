"""The typed fields of a task.toml, each read and checked as Harbor's models check it (harbor.models.task.config).

Values (TaskError with a one-line reason for one that no sample could use), network policies and their hosts,
users, [[verifier.collect]] hooks, artifacts, MCP servers, the healthcheck and environment variables. A field
that Harbor's validation rejects is rejected here with Harbor's reason.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from dataclasses import dataclass

from agentbatch.flag_checks import MAX_SECONDS, MAX_SIZE

NETWORK_MODES = ("public", "no-network", "allowlist")
MAIN = "main"
CONVENTION_ARTIFACTS = "/logs/artifacts"  # always collected, Harbor's convention entry
DEFAULT_COLLECT_TIMEOUT = 60.0
MAX_CPUS = 1e6
MAX_MEGABYTES = MAX_SIZE >> 20  # 16 TiB, as the flags' sizes
MAX_RETRIES = 10_000
_SIZE = re.compile(r"^\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)\s*([KMG])\s*$", re.IGNORECASE)
_HOST_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_SERVICE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # it names the server's toolset (mcp/config.py)
_TEMPLATE = re.compile(
    r"\$\{([^}:]+)(?::-(.*))?\}"
)  # a value that is one ${VAR} or ${VAR:-default} (Harbor's utils/env)


class TaskError(Exception):
    """A task that cannot be run: the one-line reason."""


@dataclass(frozen=True)
class Policy:
    """A network policy, Harbor's NetworkPolicy: `public`, `no-network`, or `allowlist` of `hosts` (normalized)."""

    mode: str = "public"
    hosts: tuple[str, ...] = ()

    @property
    def allowed(self) -> tuple[str, ...] | None:
        """What base.Egress takes: None anywhere, () nowhere, else the hosts."""
        return None if self.mode == "public" else self.hosts if self.mode == "allowlist" else ()


@dataclass(frozen=True)
class CollectHook:
    """A [[verifier.collect]] command: run in its service after the agent, best effort, before artifacts are taken."""

    command: str
    timeout: float = DEFAULT_COLLECT_TIMEOUT
    service: str = MAIN
    user: str | None = None


@dataclass(frozen=True)
class Artifact:
    """An `artifacts` entry: a path collected after the agent (kept in the run directory; a separate verifier
    gets it back at its source path)."""

    source: str
    destination: str | None = None
    exclude: tuple[str, ...] = ()
    service: str = MAIN


@dataclass(frozen=True)
class McpServer:
    """An [[environment.mcp_servers]] entry: offered to the agent as a toolset named after it."""

    name: str
    transport: str = "sse"  # Harbor's default; "streamable-http" ("http"), or "stdio"
    url: str | None = None
    command: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Healthcheck:
    """[environment] healthcheck: run in main after start, before the agent, as Docker's HEALTHCHECK counts."""

    command: str
    interval: float = 5.0
    timeout: float = 30.0
    start_period: float = 0.0
    start_interval: float = 5.0
    retries: int = 3


def short(value, limit: int = 60) -> str:
    """A value as a reason quotes it: its repr, at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def text(table: dict, key: str, section: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TaskError(f"{section} {key} must be a non-empty string")
    return value


def number(table: dict, key: str, section: str, maximum: float, zero: bool = False) -> float | None:
    """A positive number up to `maximum` (compared before any conversion: a 400-digit integer is no float)."""
    value = table.get(key)
    if value is None:
        return None
    numeric = not isinstance(value, bool) and isinstance(value, int | float)
    fits = numeric and ((0 <= value) if zero else (0 < value)) and value <= maximum
    if not fits:
        what = "a number from 0" if zero else "a positive number"
        raise TaskError(f"{section} {key} must be {what} up to {maximum:.15g}, not {short(value)}")
    return float(value)


def megabytes(env: dict, key: str, old_key: str, section: str) -> int | None:
    """memory_mb / storage_mb, else the deprecated "4G"-style field Harbor still reads."""
    value = number(env, key, section, MAX_MEGABYTES)
    if value is not None:
        return max(1, int(value))
    old = env.get(old_key)
    if old is None:
        return None
    match = _SIZE.match(old) if isinstance(old, str) else None
    if not match:
        raise TaskError(f"{section} {old_key} {short(old)} is not a size like '2G' or '512M'")
    amount, unit = float(match.group(1)), match.group(2).upper()
    size = amount * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]
    if not 0 < size <= MAX_MEGABYTES:
        raise TaskError(f"{section} {old_key} {short(old)} is not a size from 1K to 16384G")
    return max(1, int(size))


def user(table: dict, section: str) -> str | None:
    """[agent] / [verifier] user: a name or a uid (None: the image's user)."""
    value = table.get("user")
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, str | int)
        or (isinstance(value, int) and not 0 <= value < 2**32)
    ):
        raise TaskError(f"{section} user must be a user name or uid, not {short(value)}")
    if isinstance(value, str) and (not value.strip() or ":" in value or any(c.isspace() for c in value)):
        raise TaskError(f"{section} user {short(value)} is not a user name")
    return str(value)


def baseline(table: dict, section: str) -> Policy:
    """An environment's network policy: network_mode (public by default), else the older allow_internet."""
    allow = table.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise TaskError(f"{section} allow_internet must be true or false, not {short(allow)}")
    phase = phase_policy(table, section)
    if phase is not None:
        return phase
    if table.get("allowed_hosts") is not None:
        raise TaskError(f"{section} allowed_hosts is only valid with network_mode = 'allowlist'")
    return Policy("no-network" if allow is False else "public")


def phase_policy(table: dict, section: str) -> Policy | None:
    """A table's explicit network_mode and allowed_hosts (an [agent] or [verifier] override), None if it sets none."""
    mode = table.get("network_mode")
    hosts = table.get("allowed_hosts")
    if mode is None:
        if hosts is not None:
            raise TaskError(f"{section} allowed_hosts is only valid with network_mode = 'allowlist'")
        return None
    if mode not in NETWORK_MODES:
        raise TaskError(f"{section} network_mode {short(mode)} is not one of {', '.join(NETWORK_MODES)}")
    if mode != "allowlist" and hosts:
        raise TaskError(f"{section} allowed_hosts is only valid with network_mode = 'allowlist'")
    if hosts is not None and (not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts)):
        raise TaskError(f"{section} allowed_hosts must be a list of strings")
    return Policy(mode, tuple(dict.fromkeys(allowed_host(h, section) for h in hosts or ())))


def allowed_host(host: str, section: str) -> str:
    """One allowed_hosts entry normalized as Harbor does (a name, an address, a CIDR range); a wildcard is refused:
    the rules that enforce a policy here match addresses, which a `*.suffix` does not name."""
    host = host.strip().lower().rstrip(".")
    bad = f"{section} allowed_hosts {short(host)}: entries must be host names, IP addresses or CIDR ranges, not URLs, ports or paths"
    if not host:
        raise TaskError(f"{section} allowed_hosts entries must be non-empty host names")
    if "/" in host or ":" in host:
        try:
            if "%" in host:
                raise ValueError(host)
            if "/" in host:
                return ipaddress.ip_network(host, strict=True).compressed
            address = ipaddress.ip_address(host)
            if address.version != 6:
                raise ValueError(host)
            return address.compressed
        except ValueError:
            raise TaskError(bad) from None
    if host.startswith("*."):
        raise TaskError(
            f"{section} allowed_hosts {short(host)}: a wildcard cannot be enforced here (the egress rules match "
            "addresses); list the host names"
        )
    if "*" in host or "[" in host or not all(_HOST_LABEL.match(label) for label in host.split(".")):
        raise TaskError(bad)
    return host


def service_name(value, section: str) -> str:
    if not isinstance(value, str) or not _SERVICE.match(value.strip()):
        raise TaskError(f"{section} service {short(value)} is not a Docker Compose service name")
    return value.strip()


def collect(verifier: dict) -> list[CollectHook]:
    """The [[verifier.collect]] hooks, each in its service (main by default), as its user."""
    hooks = verifier.get("collect", [])
    if not isinstance(hooks, list) or not all(isinstance(h, dict) for h in hooks):
        raise TaskError("[verifier] collect must be a list of tables ([[verifier.collect]])")
    out = []
    for hook in hooks:
        command = text(hook, "command", "[[verifier.collect]]")
        if command is None:
            raise TaskError("[[verifier.collect]] needs a command")
        service = service_name(hook.get("service", MAIN), "[[verifier.collect]]")
        timeout = number(hook, "timeout_sec", "[[verifier.collect]]", MAX_SECONDS) or DEFAULT_COLLECT_TIMEOUT
        out.append(CollectHook(command, timeout, service, user(hook, "[[verifier.collect]]")))
    return out


def artifacts(raw: dict) -> list[Artifact]:
    """The task's `artifacts` (strings or tables), checked as Harbor's ArtifactConfig is."""
    entries = raw.get("artifacts", [])
    if not isinstance(entries, list):
        raise TaskError("artifacts must be a list of paths or tables")
    out = []
    for entry in entries:
        table = {"source": entry} if isinstance(entry, str) else entry
        if not isinstance(table, dict):
            raise TaskError(f"artifacts entry {short(entry)} is neither a path nor a table")
        source = text(table, "source", "artifacts entry")
        if source is None:
            raise TaskError("an artifacts table needs a source")
        if ".." in source.split("/"):
            raise TaskError(f"artifacts source {short(source)} must not contain '..'")
        destination = _destination(table.get("destination"))
        exclude = table.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(x, str) for x in exclude):
            raise TaskError("artifacts exclude must be a list of patterns")
        service = service_name(table.get("service") or MAIN, "artifacts entry")
        if service != MAIN and not source.startswith("/"):
            raise TaskError(f"artifacts source {short(source)} collected from service {service!r} must be absolute")
        out.append(Artifact(source, destination, tuple(exclude), service))
    return out


def _destination(value) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or "\\" in value or posixpath.isabs(value) or ".." in value.split("/"):
        raise TaskError(f"artifacts destination {short(value)} must be a relative path without '..' or backslashes")
    if value.rstrip("/") == "manifest.json":
        raise TaskError("artifacts destination 'manifest.json' is reserved for the collection manifest")
    return value


def mcp_servers(env: dict, section: str) -> list[McpServer]:
    """[[environment.mcp_servers]], checked as Harbor's MCPServerConfig is; each name is a toolset's here."""
    entries = env.get("mcp_servers", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise TaskError(f"{section} mcp_servers must be a list of tables")
    out: list[McpServer] = []
    for entry in entries:
        name = text(entry, "name", f"{section} mcp_servers")
        if name is None or not _SERVER_NAME.match(name):
            raise TaskError(
                f"{section} mcp_servers name {short(name)}: use 1 to 64 letters, digits, _ and - (it names a toolset)"
            )
        transport = entry.get("transport", "sse")
        transport = "streamable-http" if transport == "http" else transport
        if transport not in ("sse", "streamable-http", "stdio"):
            raise TaskError(
                f"{section} mcp_servers {name!r}: transport {short(transport)} is not sse, streamable-http or stdio"
            )
        url, command = text(entry, "url", f"{section} mcp_servers"), text(entry, "command", f"{section} mcp_servers")
        args = entry.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise TaskError(f"{section} mcp_servers {name!r}: args must be a list of strings")
        if transport != "stdio" and not (url and re.match(r"^https?://[^/\s]+", url)):
            raise TaskError(f"{section} mcp_servers {name!r}: an http(s) url is required for transport {transport!r}")
        if transport == "stdio" and not command:
            raise TaskError(f"{section} mcp_servers {name!r}: a command is required for transport 'stdio'")
        if name in {s.name for s in out}:
            raise TaskError(f"{section} mcp_servers: two servers are named {name!r}")
        out.append(McpServer(name, transport, url if transport != "stdio" else None, command, tuple(args)))
    return out


def healthcheck(env: dict, section: str) -> Healthcheck | None:
    table = env.get("healthcheck")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise TaskError(f"{section} healthcheck must be a table")
    where = f"{section} healthcheck"
    command = text(table, "command", where)
    if command is None:
        raise TaskError(f"{where} needs a command")
    retries = table.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 1 <= retries <= MAX_RETRIES:
        raise TaskError(f"{where} retries must be a whole number from 1 to {MAX_RETRIES}")
    seconds = {
        k: number(table, k, where, MAX_SECONDS, zero=(k == "start_period_sec")) for k in table if k.endswith("_sec")
    }
    return Healthcheck(
        command,
        interval=_or(seconds.get("interval_sec"), 5.0),
        timeout=_or(seconds.get("timeout_sec"), 30.0),
        start_period=_or(seconds.get("start_period_sec"), 0.0),
        start_interval=_or(seconds.get("start_interval_sec"), 5.0),
        retries=retries,
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def env(table: dict, section: str) -> dict[str, str]:
    """A table of environment variables, templates resolved as Harbor's resolve_env_vars does as far as no value of
    this machine's enters a container (_resolved); any other value is a literal, as in Harbor."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise TaskError(f"{section} env must be a table of strings")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise TaskError(f"{section} env {key} must be a string")
        if isinstance(val, int) and abs(val) >= 10**18:  # str() of a 5,000-digit integer raises
            raise TaskError(f"{section} env {key} must be a string")
        out[str(key)] = _resolved(str(val), section, str(key))
    return out


def _resolved(value: str, section: str, key: str) -> str:
    """A value that is one template gets, in Harbor, the host's variable, else its default, else fails the trial:
    here its default when this machine does not set the variable; otherwise the task is refused (TaskError), since
    this runner passes nothing of the machine's environment into a container."""
    template = _TEMPLATE.fullmatch(value)
    if template is None:
        return value
    name, default = template.group(1), template.group(2)
    if default is not None and name not in os.environ:
        return default
    why = "is set on this machine" if name in os.environ else "has no default"
    raise TaskError(
        f"{section} env {key} takes ${{{name}}} from the host, which {why}: this runner passes no value of the "
        "machine's environment into a container (write the value, or a ${VAR:-default} for an unset VAR)"
    )
