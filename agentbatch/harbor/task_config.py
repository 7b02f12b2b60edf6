"""A Harbor task.toml read into `TaskConfig`, in both published schemas (docs/harbor.md, "task.toml").

terminal-bench 2.x writes `version = "2.0"` with `[metadata] author_name ...` and `[environment] workdir`;
Harbor's newer tasks write `schema_version = "1.x"` with a `[task]` table (name, description, authors,
keywords). Both share `[agent]`, `[verifier]`, `[environment]` and `[solution]`. `[metadata]` is free-form:
difficulty, category and tags are read from it, the rest kept. A field neither schema has is ignored with a
warning, and so is a field both know that this runner does not apply (gpus, users, healthchecks ...).
"""

from __future__ import annotations

import math
import posixpath
import re
import tomllib
from dataclasses import dataclass, field

# Every field of the two schemas, by table; None: a table whose keys are free (metadata, env).
KNOWN: dict[str, set[str] | None] = {
    "": {
        "version",
        "schema_version",
        "source",
        "task",
        "metadata",
        "agent",
        "verifier",
        "environment",
        "solution",
    },
    "task": {"name", "description", "authors", "keywords"},
    "metadata": None,
    "agent": {"timeout_sec", "setup_timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {"timeout_sec", "env", "user", "network_mode", "allowed_hosts"},
    "environment": {
        "build_timeout_sec",
        "docker_image",
        "cpus",
        "memory_mb",
        "storage_mb",
        "memory",
        "storage",
        "gpus",
        "gpu_types",
        "allow_internet",
        "network_mode",
        "allowed_hosts",
        "workdir",
        "env",
        "mcp_servers",
        "skills_dir",
        "healthcheck",
        "os",
        "tpu",
    },
    "solution": {"env"},
}
# Known fields this runner does not apply, when set to something other than their neutral value.
NOT_APPLIED = {
    ("agent", "setup_timeout_sec"): "no agent is installed, so there is no setup",
    ("agent", "user"): "the agent runs as the image's user",
    ("verifier", "user"): "the verifier runs as the image's user",
    ("agent", "network_mode"): "one network setting per task: [environment]",
    ("verifier", "network_mode"): "one network setting per task: [environment]",
    ("agent", "allowed_hosts"): "no host allowlist",
    ("verifier", "allowed_hosts"): "no host allowlist",
    ("environment", "allowed_hosts"): "no host allowlist: the network is on",
    ("environment", "gpus"): "no GPUs are given to containers",
    ("environment", "gpu_types"): "no GPUs are given to containers",
    ("environment", "mcp_servers"): "no MCP servers are started",
    ("environment", "skills_dir"): "no skills are copied",
    ("environment", "healthcheck"): "no healthcheck is run",
    ("environment", "tpu"): "no TPUs",
    ("solution", "env"): "solve.sh runs in the container's environment",
}
DEFAULT_VERIFIER_TIMEOUT = 600.0  # Harbor's defaults
DEFAULT_BUILD_TIMEOUT = 600.0
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMG])\s*$", re.IGNORECASE)


class TaskError(Exception):
    """A task that cannot be run: the one-line reason."""


@dataclass
class TaskConfig:
    """What this runner takes from a task.toml; None where the task leaves it to the run's flags."""

    schema: str = ""
    name: str | None = None
    metadata: dict = field(default_factory=dict)
    difficulty: str | None = None
    category: str | None = None
    tags: list[str] = field(default_factory=list)
    agent_timeout: float | None = None
    verifier_timeout: float = DEFAULT_VERIFIER_TIMEOUT
    verifier_env: dict[str, str] = field(default_factory=dict)
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool = True
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> tuple[TaskConfig, list[str]]:
    """The config and a warning per field ignored; TaskError (one line) if the TOML or a field is unusable."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"task.toml is not valid TOML: {e}") from None
    warnings = _unknown(raw)
    tables = {name: _table(raw, name) for name in KNOWN if name}
    for (section, key), why in NOT_APPLIED.items():
        value = tables[section].get(key)
        if value not in (None, 0, [], {}, "", "public"):
            warnings.append(f"[{section}] {key} is not applied ({why})")
    meta, task, agent, verifier, env = (tables[n] for n in ("metadata", "task", "agent", "verifier", "environment"))
    cfg = TaskConfig(schema=str(raw.get("schema_version") or raw.get("version") or ""), metadata=meta)
    cfg.name = _text(task, "name", "task")
    cfg.difficulty = _text(meta, "difficulty", "metadata")
    cfg.category = _text(meta, "category", "metadata")
    tags = meta.get("tags", task.get("keywords", []))
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskError("[metadata] tags must be a list of strings")
    cfg.tags = list(tags)
    cfg.agent_timeout = _seconds(agent, "timeout_sec", "agent")
    cfg.verifier_timeout = _seconds(verifier, "timeout_sec", "verifier") or DEFAULT_VERIFIER_TIMEOUT
    cfg.build_timeout = _seconds(env, "build_timeout_sec", "environment") or DEFAULT_BUILD_TIMEOUT
    cfg.verifier_env = _env(verifier, "verifier", warnings)
    cfg.env = _env(env, "environment", warnings)
    cfg.docker_image = _text(env, "docker_image", "environment")
    cfg.cpus = _number(env, "cpus", "environment")
    cfg.memory_mb = _megabytes(env, "memory_mb", "memory")
    cfg.storage_mb = _megabytes(env, "storage_mb", "storage")
    cfg.allow_internet = _network(env, warnings)
    cfg.workdir = _text(env, "workdir", "environment")
    if cfg.workdir is not None and not posixpath.isabs(cfg.workdir):
        raise TaskError(f"[environment] workdir {cfg.workdir!r} is not an absolute path")
    os_name = env.get("os", "linux")
    if str(os_name).lower() != "linux":
        raise TaskError(f"[environment] os = {os_name!r}: only Linux tasks can run here")
    return cfg, warnings


def _unknown(raw: dict) -> list[str]:
    out = [f"unknown field {key!r} ignored" for key in raw if key not in KNOWN[""]]
    for section, keys in KNOWN.items():
        if section and keys is not None and isinstance(raw.get(section), dict):
            out += [f"unknown field [{section}] {key} ignored" for key in raw[section] if key not in keys]
    return out


def _table(raw: dict, name: str) -> dict:
    value = raw.get(name, {})
    if not isinstance(value, dict):
        raise TaskError(f"[{name}] must be a table, not {type(value).__name__}")
    return value


def _text(table: dict, key: str, section: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TaskError(f"[{section}] {key} must be a non-empty string")
    return value


def _number(table: dict, key: str, section: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise TaskError(f"[{section}] {key} must be a positive number, not {value!r}")
    return float(value)


def _seconds(table: dict, key: str, section: str) -> float | None:
    return _number(table, key, section)


def _megabytes(env: dict, key: str, old_key: str) -> int | None:
    """memory_mb / storage_mb, else the deprecated "4G"-style field Harbor still reads."""
    value = _number(env, key, "environment")
    if value is not None:
        return int(value)
    old = env.get(old_key)
    if old is None:
        return None
    match = _SIZE.match(str(old))
    if not match:
        raise TaskError(f"[environment] {old_key} {old!r} is not a size like '2G' or '512M'")
    number, unit = float(match.group(1)), match.group(2).upper()
    return max(1, int(number * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]))


def _network(env: dict, warnings: list[str]) -> bool:
    allow = env.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise TaskError(f"[environment] allow_internet must be true or false, not {allow!r}")
    mode = env.get("network_mode")
    if mode is None:
        return allow
    if mode == "no-network":
        return False
    if mode == "allowlist":
        warnings.append("[environment] network_mode = 'allowlist' is not applied: the network is on")
        return True
    if mode == "public":
        return True
    raise TaskError(f"[environment] network_mode {mode!r} is not one of public, no-network, allowlist")


def _env(table: dict, section: str, warnings: list[str]) -> dict[str, str]:
    """A table of environment variables; ${VAR} templates (read from the host) are left out: no host value leaks."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise TaskError(f"[{section}] env must be a table of strings")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise TaskError(f"[{section}] env {key} must be a string")
        text = str(val)
        if "${" in text:
            warnings.append(f"[{section}] env {key} is not set: host variables (${{...}}) are not passed in")
            continue
        out[str(key)] = text
    return out
