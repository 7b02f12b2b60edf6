"""A Harbor task.toml read into `TaskConfig`, in every published schema (docs/harbor.md, "task.toml").

terminal-bench 2.x writes `version = "2.0"` with `[metadata] author_name ...` and `[environment] workdir`;
Harbor's own tasks write `schema_version = "1.0"` .. `"1.4"` with a `[task]` table (name, version,
description, authors, keywords), and 1.4 adds `artifacts`, `[[steps]]`, `[verifier] environment_mode`,
`[verifier.environment]` and `[[verifier.collect]]` (Harbor's harbor.models.task.config). `[metadata]` is
free-form: difficulty, category and tags are read from it, the rest kept. A field no schema has is ignored
with a warning; a known field this runner does not apply gets one too (gpus, users, healthchecks ...).
Every number is bounded here, at load, so that no value the loader accepts breaks a sample later.
"""

from __future__ import annotations

import posixpath
import re
import tomllib
from dataclasses import dataclass, field

from agentbatch.flag_checks import MAX_SECONDS, MAX_SIZE

# Every field of every schema version, by table; None: a table whose keys are free (metadata).
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
        "artifacts",
        "steps",
        "multi_step_reward_strategy",
    },
    "task": {"name", "version", "description", "authors", "keywords"},
    "metadata": None,
    "agent": {"timeout_sec", "setup_timeout_sec", "user", "network_mode", "allowed_hosts"},
    "verifier": {
        "timeout_sec",
        "env",
        "user",
        "network_mode",
        "allowed_hosts",
        "environment_mode",
        "environment",
        "collect",
    },
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
COLLECT_KEYS = {"command", "service", "timeout_sec", "user"}  # a [[verifier.collect]] entry
# Known fields this runner does not apply, when set to something other than their neutral value.
NOT_APPLIED = {
    ("", "artifacts"): "no files are collected from the container: the line keeps the check's output",
    ("agent", "setup_timeout_sec"): "no agent is installed, so there is no setup",
    ("agent", "user"): "the agent runs as the image's user",
    ("verifier", "user"): "the verifier runs as the image's user",
    ("agent", "allowed_hosts"): "no host allowlist",
    ("verifier", "allowed_hosts"): "no host allowlist",
    ("verifier", "environment"): "the tests run in the agent's container (a separate verifier is not run)",
    ("environment", "allowed_hosts"): "no host allowlist: the network is on",
    ("environment", "gpus"): "no GPUs are given to containers",
    ("environment", "gpu_types"): "no GPUs are given to containers",
    ("environment", "mcp_servers"): "no MCP servers are started",
    ("environment", "skills_dir"): "no skills are copied",
    ("environment", "healthcheck"): "no healthcheck is run",
    ("environment", "tpu"): "no TPUs",
    ("solution", "env"): "solve.sh runs in the container's environment",
}
NETWORK_MODES = ("public", "no-network", "allowlist")
DEFAULT_VERIFIER_TIMEOUT = 600.0  # Harbor's defaults
DEFAULT_BUILD_TIMEOUT = 600.0
DEFAULT_COLLECT_TIMEOUT = 60.0
MAX_CPUS = 1e6
MAX_MEGABYTES = MAX_SIZE >> 20  # 16 TiB, as the flags' sizes
_SIZE = re.compile(r"^\s*([0-9]{1,12}(?:\.[0-9]{1,12})?)\s*([KMG])\s*$", re.IGNORECASE)


class TaskError(Exception):
    """A task that cannot be run: the one-line reason."""


@dataclass(frozen=True)
class CollectHook:
    """A [[verifier.collect]] command of the main service: run in the container before the tests, best effort."""

    command: str
    timeout: float = DEFAULT_COLLECT_TIMEOUT


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
    collect: list[CollectHook] = field(default_factory=list)
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    allow_internet: bool = True  # the agent's network: [agent] network_mode, else [environment]'s
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
    tables[""] = raw
    if raw.get("steps"):
        raise TaskError("a multi-step task ([[steps]]): this runner runs single-step tasks only")
    for (section, key), why in NOT_APPLIED.items():
        if _set(tables[section].get(key)):
            warnings.append(f"{_field(section, key)} is not applied ({why})")
    meta, task, agent, verifier, env = (tables[n] for n in ("metadata", "task", "agent", "verifier", "environment"))
    cfg = TaskConfig(schema=str(raw.get("schema_version") or raw.get("version") or ""), metadata=meta)
    cfg.name = _text(task, "name", "task")
    cfg.difficulty = _text(meta, "difficulty", "metadata")
    cfg.category = _text(meta, "category", "metadata")
    tags = meta.get("tags", task.get("keywords", []))
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskError("[metadata] tags must be a list of strings")
    cfg.tags = list(tags)
    cfg.agent_timeout = _number(agent, "timeout_sec", "agent", MAX_SECONDS)
    cfg.verifier_timeout = _number(verifier, "timeout_sec", "verifier", MAX_SECONDS) or DEFAULT_VERIFIER_TIMEOUT
    cfg.build_timeout = _number(env, "build_timeout_sec", "environment", MAX_SECONDS) or DEFAULT_BUILD_TIMEOUT
    cfg.verifier_env = _env(verifier, "verifier", warnings)
    cfg.collect = _collect(verifier, warnings)
    _verifier_mode(verifier, warnings)
    cfg.env = _env(env, "environment", warnings)
    cfg.docker_image = _text(env, "docker_image", "environment")
    cfg.cpus = _number(env, "cpus", "environment", MAX_CPUS)
    cfg.memory_mb = _megabytes(env, "memory_mb", "memory")
    cfg.storage_mb = _megabytes(env, "storage_mb", "storage")
    cfg.allow_internet = _network(env, agent, verifier, warnings)
    cfg.workdir = _text(env, "workdir", "environment")
    if cfg.workdir is not None and not posixpath.isabs(cfg.workdir):
        raise TaskError(f"[environment] workdir {cfg.workdir!r} is not an absolute path")
    os_name = env.get("os", "linux")
    if str(os_name).lower() != "linux":
        raise TaskError(f"[environment] os = {_short(os_name)}: only Linux tasks can run here")
    return cfg, warnings


def _field(section: str, key: str) -> str:
    return f"[{section}] {key}" if section else key


def _set(value) -> bool:
    """Whether a field is set to something other than its neutral value."""
    return value not in (None, 0, [], {}, "", False)


def _short(value, limit: int = 60) -> str:
    """A value as a warning quotes it: its repr, at most `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _unknown(raw: dict) -> list[str]:
    out = [f"unknown field {key!r} ignored" for key in raw if key not in KNOWN[""]]
    for section, keys in KNOWN.items():
        if section and keys is not None and isinstance(raw.get(section), dict):
            out += [f"unknown field [{section}] {key} ignored" for key in raw[section] if key not in keys]
    hooks = (raw.get("verifier") or {}).get("collect") if isinstance(raw.get("verifier"), dict) else None
    for hook in hooks if isinstance(hooks, list) else ():
        if isinstance(hook, dict):
            out += [f"unknown field [[verifier.collect]] {key} ignored" for key in hook if key not in COLLECT_KEYS]
    return list(dict.fromkeys(out))


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


def _number(table: dict, key: str, section: str, maximum: float) -> float | None:
    """A positive number up to `maximum` (compared before any conversion: a 400-digit integer is no float)."""
    value = table.get(key)
    if value is None:
        return None
    fits = not isinstance(value, bool) and isinstance(value, int | float) and 0 < value <= maximum
    if not fits:
        raise TaskError(f"[{section}] {key} must be a positive number up to {maximum:.15g}, not {_short(value)}")
    return float(value)


def _megabytes(env: dict, key: str, old_key: str) -> int | None:
    """memory_mb / storage_mb, else the deprecated "4G"-style field Harbor still reads."""
    value = _number(env, key, "environment", MAX_MEGABYTES)
    if value is not None:
        return max(1, int(value))
    old = env.get(old_key)
    if old is None:
        return None
    match = _SIZE.match(old) if isinstance(old, str) else None
    if not match:
        raise TaskError(f"[environment] {old_key} {_short(old)} is not a size like '2G' or '512M'")
    number, unit = float(match.group(1)), match.group(2).upper()
    megabytes = number * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]
    if not 0 < megabytes <= MAX_MEGABYTES:
        raise TaskError(f"[environment] {old_key} {_short(old)} is not a size from 1K to 16384G")
    return max(1, int(megabytes))


def _mode(table: dict, section: str, default: str | None) -> str | None:
    """A table's network_mode (allowed_hosts alone means "allowlist", as in Harbor), else `default`."""
    mode = table.get("network_mode")
    if mode is None:
        return "allowlist" if table.get("allowed_hosts") else default
    if mode not in NETWORK_MODES:
        raise TaskError(f"[{section}] network_mode {_short(mode)} is not one of {', '.join(NETWORK_MODES)}")
    return mode


def _network(env: dict, agent: dict, verifier: dict, warnings: list[str]) -> bool:
    """Whether the container has a network: the agent's mode, else [environment]'s (allow_internet is the old way).

    One container serves the agent and the tests, so the verifier's mode applies only where it agrees.
    """
    allow = env.get("allow_internet", True)
    if not isinstance(allow, bool):
        raise TaskError(f"[environment] allow_internet must be true or false, not {_short(allow)}")
    baseline = _mode(env, "environment", "public" if allow else "no-network")
    agent_mode = _mode(agent, "agent", baseline)
    verifier_mode = _mode(verifier, "verifier", baseline)
    if agent_mode == "allowlist":
        where = "[agent]" if agent.get("network_mode") or agent.get("allowed_hosts") else "[environment]"
        warnings.append(f"{where} network_mode = 'allowlist' is not applied: the network is on")
    if verifier_mode != agent_mode:
        warnings.append(
            f"[verifier] network_mode = {verifier_mode!r} is not applied: "
            f"the tests run in the agent's container, with its network ({agent_mode!r})"
        )
    return agent_mode != "no-network"


def _verifier_mode(verifier: dict, warnings: list[str]) -> None:
    """[verifier] environment_mode: "shared" is what this runner does; "separate" is warned about."""
    mode = verifier.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        raise TaskError(f"[verifier] environment_mode {_short(mode)} is not one of shared, separate")
    if mode == "shared" and verifier.get("environment") is not None:
        raise TaskError("[verifier] environment_mode = 'shared' conflicts with [verifier.environment]")
    if mode == "separate" and verifier.get("environment") is None:  # else NOT_APPLIED's [verifier] environment
        warnings.append(
            f"[verifier] environment_mode = 'separate' is not applied ({NOT_APPLIED['verifier', 'environment']})"
        )


def _collect(verifier: dict, warnings: list[str]) -> list[CollectHook]:
    """The [[verifier.collect]] hooks of the main service; the others (Compose sidecars) are warned about."""
    hooks = verifier.get("collect", [])
    if not isinstance(hooks, list) or not all(isinstance(h, dict) for h in hooks):
        raise TaskError("[verifier] collect must be a list of tables ([[verifier.collect]])")
    out = []
    for hook in hooks:
        command = _text(hook, "command", "[verifier.collect]")
        if command is None:
            raise TaskError("[[verifier.collect]] needs a command")
        service = hook.get("service", "main")
        if service != "main":
            warnings.append(f"[[verifier.collect]] service = {_short(service)} is not applied: no Compose services")
            continue
        if _set(hook.get("user")):
            warnings.append("[[verifier.collect]] user is not applied (hooks run as the image's user)")
        timeout = _number(hook, "timeout_sec", "[verifier.collect]", MAX_SECONDS) or DEFAULT_COLLECT_TIMEOUT
        out.append(CollectHook(command, timeout))
    return out


def _env(table: dict, section: str, warnings: list[str]) -> dict[str, str]:
    """A table of environment variables; ${VAR} templates (read from the host) are left out: no host value leaks."""
    value = table.get("env", {})
    if not isinstance(value, dict):
        raise TaskError(f"[{section}] env must be a table of strings")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(val, str | int | float) or isinstance(val, bool):
            raise TaskError(f"[{section}] env {key} must be a string")
        if isinstance(val, int) and abs(val) >= 10**18:  # str() of a 5,000-digit integer raises
            raise TaskError(f"[{section}] env {key} must be a string")
        text = str(val)
        if "${" in text:
            warnings.append(f"[{section}] env {key} is not set: host variables (${{...}}) are not passed in")
            continue
        out[str(key)] = text
    return out
