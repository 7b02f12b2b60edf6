"""A Harbor task.toml read into `TaskConfig`, in every published schema (docs/harbor.md, "task.toml").

terminal-bench 2.x writes `version = "2.0"` with `[metadata] author_name ...` and `[environment] workdir`;
Harbor's own tasks write `schema_version = "1.0"` .. `"1.4"` with a `[task]` table (name, version,
description, authors, keywords); 1.2 adds `artifacts`, `[verifier] environment_mode` and
`[verifier.environment]`, 1.3 the network policies of every table and `[[verifier.collect]]` (Harbor's
harbor.models.task.config, whose meaning every field here has: no field depends on the version). `[metadata]`
is free-form: difficulty, category and tags are read from it, the rest kept. A field no schema has is ignored
with a warning; one this runner cannot do as Harbor does refuses the task (task_fields.TaskError, one line).
Every number is bounded here, at load, so that no value the loader accepts breaks a sample later.
"""

from __future__ import annotations

import posixpath
import tomllib
from dataclasses import dataclass, field

from agentbatch.flag_checks import MAX_SECONDS
from agentbatch.harbor import task_fields as f
from agentbatch.harbor.task_fields import (
    MAIN,
    Artifact,
    CollectHook,
    Healthcheck,
    McpServer,
    Policy,
    TaskError,
    short,
)

__all__ = ["TaskConfig", "EnvConfig", "TaskError", "parse", "CollectHook", "Artifact", "McpServer", "Policy"]

ENVIRONMENT_KEYS = {
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
}
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
    "agent": {"timeout_sec", "user", "network_mode", "allowed_hosts"},
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
    "environment": ENVIRONMENT_KEYS,
    "verifier.environment": ENVIRONMENT_KEYS,
    "solution": {"env"},
}
COLLECT_KEYS = {"command", "service", "timeout_sec", "user"}  # a [[verifier.collect]] entry
DEFAULT_VERIFIER_TIMEOUT = 600.0  # Harbor's defaults
DEFAULT_BUILD_TIMEOUT = 600.0


@dataclass
class EnvConfig:
    """An environment: [environment], or [verifier.environment] (a separate verifier's own)."""

    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    docker_image: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    network: Policy = field(default_factory=Policy)  # the baseline: set as it starts
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    healthcheck: Healthcheck | None = None
    mcp_servers: list[McpServer] = field(default_factory=list)
    skills_dir: str | None = None


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
    agent_user: str | None = None
    agent_network: Policy | None = None  # [agent]'s override, during the agent only
    verifier_timeout: float = DEFAULT_VERIFIER_TIMEOUT
    verifier_env: dict[str, str] = field(default_factory=dict)
    verifier_user: str | None = None
    verifier_network: Policy | None = None  # [verifier]'s override, during the tests only
    separate: bool = False  # [verifier] environment_mode: the tests in a container of their own
    verifier_environment: EnvConfig | None = None  # [verifier.environment], when the task gives one
    collect: list[CollectHook] = field(default_factory=list)
    environment: EnvConfig = field(default_factory=EnvConfig)
    solution_env: dict[str, str] = field(default_factory=dict)
    artifacts: list[Artifact] = field(default_factory=list)

    # The agent's environment, as the rest of the code names it.
    docker_image = property(lambda self: self.environment.docker_image)
    cpus = property(lambda self: self.environment.cpus)
    memory_mb = property(lambda self: self.environment.memory_mb)
    storage_mb = property(lambda self: self.environment.storage_mb)
    workdir = property(lambda self: self.environment.workdir)
    env = property(lambda self: self.environment.env)
    build_timeout = property(lambda self: self.environment.build_timeout)

    @property
    def verifier_config(self) -> EnvConfig:
        """A separate verifier's environment: [verifier.environment], else a copy of [environment] (Harbor's
        resolve_effective_verifier_env_config)."""
        return self.verifier_environment or self.environment

    def policies(self) -> tuple[Policy, Policy, Policy, Policy]:
        """Harbor's network plan (trial/network_policy.py): the agent's container at start and during the agent,
        the verifier's (the agent's own in shared mode) at start and during the tests."""
        agent_baseline = self.environment.network
        verifier_baseline = self.verifier_config.network if self.separate else agent_baseline
        return (
            agent_baseline,
            self.agent_network or agent_baseline,
            verifier_baseline,
            self.verifier_network or verifier_baseline,
        )

    def services(self) -> set[str]:
        """The Compose services other than main that its hooks and artifacts name."""
        return {h.service for h in self.collect if h.service != MAIN} | {
            a.service for a in self.artifacts if a.service != MAIN
        }


def parse(text: str) -> tuple[TaskConfig, list[str]]:
    """The config and a warning per field ignored; TaskError (one line) if the TOML or a field is unusable."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"task.toml is not valid TOML: {e}") from None
    warnings = _unknown(raw)
    tables = {name: _table(raw, name) for name in KNOWN if name and "." not in name}
    if raw.get("steps"):
        raise TaskError("a multi-step task ([[steps]]): this runner runs single-step tasks only")
    meta, task, agent, verifier = (tables[n] for n in ("metadata", "task", "agent", "verifier"))
    cfg = TaskConfig(schema=str(raw.get("schema_version") or raw.get("version") or ""), metadata=meta)
    cfg.name = f.text(task, "name", "[task]")
    cfg.difficulty = f.text(meta, "difficulty", "[metadata]")
    cfg.category = f.text(meta, "category", "[metadata]")
    tags = meta.get("tags", task.get("keywords", []))
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskError("[metadata] tags must be a list of strings")
    cfg.tags = list(tags)
    cfg.agent_timeout = f.number(agent, "timeout_sec", "[agent]", MAX_SECONDS)
    cfg.agent_user = f.user(agent, "[agent]")
    cfg.agent_network = f.phase_policy(agent, "[agent]")
    cfg.environment = environment(tables["environment"], "[environment]", warnings)
    _verifier(cfg, verifier, warnings)
    cfg.artifacts = f.artifacts(raw)
    cfg.solution_env = f.env(tables["solution"], "[solution]")
    return cfg, warnings


def _verifier(cfg: TaskConfig, verifier: dict, warnings: list[str]) -> None:
    """[verifier]: its time limit, env, user, network override, mode and own environment, collect hooks."""
    cfg.verifier_timeout = f.number(verifier, "timeout_sec", "[verifier]", MAX_SECONDS) or DEFAULT_VERIFIER_TIMEOUT
    cfg.verifier_env = f.env(verifier, "[verifier]")
    cfg.verifier_user = f.user(verifier, "[verifier]")
    cfg.verifier_network = f.phase_policy(verifier, "[verifier]")
    cfg.collect = f.collect(verifier)
    mode = verifier.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        raise TaskError(f"[verifier] environment_mode {short(mode)} is not one of shared, separate")
    own = verifier.get("environment")
    if own is not None and not isinstance(own, dict):
        raise TaskError("[verifier.environment] must be a table")
    if mode == "shared" and own is not None:
        raise TaskError("[verifier] environment_mode = 'shared' conflicts with [verifier.environment]")
    cfg.separate = mode == "separate" or (mode is None and own is not None)  # Harbor's verifier_mode.py
    if own is not None:
        cfg.verifier_environment = environment(own, "[verifier.environment]", warnings)


def environment(env: dict, section: str, warnings: list[str]) -> EnvConfig:
    """[environment] or [verifier.environment]: the image, its limits, network, variables and start."""
    out = EnvConfig(
        build_timeout=f.number(env, "build_timeout_sec", section, MAX_SECONDS) or DEFAULT_BUILD_TIMEOUT,
        docker_image=f.text(env, "docker_image", section),
        cpus=f.number(env, "cpus", section, f.MAX_CPUS),
        memory_mb=f.megabytes(env, "memory_mb", "memory", section),
        storage_mb=f.megabytes(env, "storage_mb", "storage", section),
        network=f.baseline(env, section),
        workdir=f.text(env, "workdir", section),
        env=f.env(env, section),
        healthcheck=f.healthcheck(env, section),
        mcp_servers=f.mcp_servers(env, section),
        skills_dir=f.text(env, "skills_dir", section),
    )
    if out.workdir is not None and not posixpath.isabs(out.workdir):
        raise TaskError(f"{section} workdir {out.workdir!r} is not an absolute path")
    os_name = env.get("os", "linux")
    if str(os_name).lower() != "linux":
        raise TaskError(f"{section} os = {short(os_name)}: only Linux tasks can run here")
    gpus = env.get("gpus")
    if gpus not in (None, 0):  # Harbor's docker environment refuses them too (base.py, _validate_gpu_support)
        raise TaskError(f"{section} gpus = {short(gpus)}: containers here get no GPUs")
    if env.get("tpu") is not None:
        raise TaskError(f"{section} tpu: containers here get no TPUs")
    return out


def _unknown(raw: dict) -> list[str]:
    out = [f"unknown field {key!r} ignored" for key in raw if key not in KNOWN[""]]
    for section, keys in KNOWN.items():
        parent, _, child = section.partition(".")
        table = raw.get(parent) if parent else None
        if child and isinstance(table, dict):
            table = table.get(child)
        if section and keys is not None and isinstance(table, dict):
            out += [f"unknown field [{section}] {key} ignored" for key in table if key not in keys]
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
