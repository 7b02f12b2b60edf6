"""A run's settings: every flag's checked value, typed, grouped by concern, built once and never changed.

One builder, `build`, from a mapping of flag values (what Fire gives the CLI, or a Python caller's keyword
arguments): each value is checked by its flag's declaration (flags.FLAGS, in table order, the first bad one a
FatalError), the plug-ins the run names are loaded, and the values its `--model` implies
(model.registry.implied_flags: `--model=oracle`'s) stand in for the defaults of the flags not given. Each flag
names its group and field in FLAGS; tests/test_settings.py holds every flag to exactly one field here. The
groups are frozen: a caller derives other settings with `dataclasses.replace`, or builds them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import agentbatch.flags as flags
import agentbatch.plugins as plugins
from agentbatch.errors import FatalError
from agentbatch.limits import PromptLimits, TimeoutBounds
from agentbatch.model import registry as models
from agentbatch.model.usage import Prices
from agentbatch.run_dir.paths import run_path
from agentbatch.sandboxes.base import SandboxSettings


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """The run and its dataset: where it is written, which rows, how many samples of each, how it is shown."""

    dataset_file: str | None
    batch_size: int | None
    run_name: str | None
    output_dir: str
    max_samples: int | None
    samples_per_prompt: int
    seed: int | None
    resume: bool
    rescore: bool  # check a finished run's samples again, with no model call (rescore.py)
    plugins: tuple[str, ...]
    verbose: bool
    progress_seconds: float
    log_prefix_chars: int
    list_distributions: bool

    @property
    def run_dir(self) -> str:
        """<output_dir>/<run_name>/ (run_dir.paths.run_path)."""
        if self.run_name is None:
            raise FatalError("--run_name is required: output goes to data/<run_name>/")
        return run_path(self.output_dir, self.run_name)


@dataclass(frozen=True, kw_only=True)
class ModelFlags:
    """The model, its endpoint, and what every call of it asks for or is sent."""

    model: str
    base_url: str
    api_key: str | None = field(repr=False)  # None: taken from the environment when the run starts
    local_model_path: str | None
    max_tokens: int | None
    request_timeout: float
    max_retries: int
    providers_allowed: tuple[str, ...]
    providers_ignored: tuple[str, ...]
    providers_order: tuple[str, ...]
    provider_sort: str | None
    reasoning_effort: str | None
    reasoning_disabled: bool
    logprobs: bool
    token_ids: bool
    tokenizer: str | None
    policy_version: str | None  # a label of the policy served (a training step's), recorded on every sample
    ephemeral_system_prompt: str | None
    prefill_messages: list[dict]  # --prefill_messages_file's messages, read and checked
    cache: bool  # calls answered from the model-call cache (model/cache.py) when they can be
    cache_dir: str | None  # None: the user's cache directory's (model.cache.default_directory)
    cache_expiry: float | None  # seconds a stored reply is used; None: always
    cache_size: int  # the cache's bound in bytes

    @property
    def local(self) -> bool:
        """The embedded model (--model=local or --base_url=local): served on loopback, no endpoint, no key."""
        return self.model == "local" or self.base_url == "local"


@dataclass(frozen=True, kw_only=True)
class ToolFlags:
    """The run's tools: its distribution, its own tools and MCP servers, and the tools' settings."""

    distribution: str
    tools: tuple[str, ...]
    mcp_config: str | None
    distributions_file: str | None
    command_timeout: float
    allow_private_urls: bool
    vision_model: str | None
    image_model: str | None
    image_base_url: str | None
    moa_models: tuple[str, ...]
    moa_aggregator: str | None


@dataclass(frozen=True, kw_only=True)
class SandboxFlags:
    """Which sandbox the samples get, and its limits (bwrap's rlimits, docker's container limits)."""

    sandbox: str | None
    sandbox_network: bool
    sandbox_memory: int
    sandbox_processes: int
    sandbox_file_size: int
    sandbox_cpu_seconds: int
    docker_image: str
    docker_memory: str
    docker_cpus: float
    docker_pids: int
    keep_final_state: bool  # each sample's sandbox kept as its agent left it, for --rescore (sample_state.py)

    def settings(self) -> SandboxSettings:
        """The sandbox settings before the backends are chosen (sandboxes.choice.choose sets them)."""
        return SandboxSettings(
            docker_image=self.docker_image,
            memory=self.docker_memory,
            cpus=self.docker_cpus,
            pids=self.docker_pids,
            network=self.sandbox_network,
            processes=self.sandbox_processes,
            memory_bytes=self.sandbox_memory,
            file_size_bytes=self.sandbox_file_size,
            cpu_seconds=self.sandbox_cpu_seconds,
        )


@dataclass(frozen=True, kw_only=True)
class LimitFlags:
    """Each sample's limits (docs/limits.md), and the bounds they set on a task's own."""

    max_turns: int
    max_tokens_per_prompt: int | None
    max_cost_per_prompt: float | None
    prompt_timeout: float | None
    check_timeout: float
    timeout_multiplier: float

    def prompt_limits(self) -> PromptLimits:
        return PromptLimits(self.prompt_timeout, self.max_tokens_per_prompt, self.max_cost_per_prompt)


@dataclass(frozen=True, kw_only=True)
class QualityFlags:
    """The quality filters: which finished samples are discarded."""

    require_reasoning: bool
    require_pass: bool


@dataclass(frozen=True, kw_only=True)
class BudgetFlags:
    """The run's budgets, and the prices its costs are computed with where the endpoint reports none."""

    budget_usd: float | None
    budget_tokens: int | None
    price_input: float | None
    price_output: float | None

    @property
    def priced(self) -> bool:
        """Prices were given (else only an endpoint that reports costs tells them)."""
        return self.price_input is not None or self.price_output is not None

    def prices(self) -> Prices:
        return Prices(self.price_input or 0.0, self.price_output or 0.0)


@dataclass(frozen=True, kw_only=True)
class ScaleFlags:
    """How many samples run at once, and where (this machine's worker processes, or a Ray cluster)."""

    num_workers: int
    concurrency: int | None
    sandbox_starts: int | None
    ray_address: str | None

    @property
    def slots(self) -> int:
        """Samples in flight: --concurrency, else --num_workers."""
        return self.concurrency or self.num_workers


@dataclass(frozen=True, kw_only=True)
class OutputFlags:
    """What is written from the run's files besides them: the exports, their filters, the report."""

    export: tuple[str, ...]
    export_completed_only: bool
    export_no_partial: bool
    export_no_tool_errors: bool
    export_min_turns: int
    export_toolsets: tuple[str, ...]
    export_passed_only: bool
    report: bool
    compare: tuple[str, ...]

    @property
    def asked(self) -> bool:
        """Whether an export or a report is asked for."""
        return bool(self.export or self.report or self.compare)


@dataclass(frozen=True, kw_only=True)
class ServeFlags:
    """`batch_runner.py serve` (docs/rollouts.md): where it listens."""

    host: str
    port: int


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every flag's checked value, by concern (each group's fields are the flags that name it in flags.FLAGS)."""

    run: RunFlags
    model: ModelFlags
    tools: ToolFlags
    sandbox: SandboxFlags
    limits: LimitFlags
    quality: QualityFlags
    budget: BudgetFlags
    scale: ScaleFlags
    output: OutputFlags
    serve: ServeFlags
    given: frozenset[str] = frozenset()  # the flags given (on the command line, or as keywords), not defaulted

    def timeout_bounds(self) -> TimeoutBounds:
        """The flags over every task's own limits: a default --check_timeout does not lower a task's own."""
        check_timeout = self.limits.check_timeout if "check_timeout" in self.given else None
        return TimeoutBounds(self.limits.timeout_multiplier, self.limits.prompt_timeout, check_timeout)


# Each group's name (a field of Settings, what a flag's `group` says) and its class.
GROUPS: dict[str, type] = {f.name: globals()[str(f.type)] for f in fields(Settings) if f.name != "given"}


def build(values: Mapping[str, Any]) -> Settings:
    """The settings of these flag values (module docstring); FatalError naming the first bad one."""
    checked = flags.parse(values)
    plugins.load(checked["plugins"])  # before anything asks for a tool, a backend, a dataset format or a model
    implied = models.implied_flags(checked["model"])  # what --model=NAME needs, for the flags not given
    if implied:
        checked = flags.parse(values, implied)
    return assemble(checked, frozenset(values))


def assemble(checked: Mapping[str, Any], given: frozenset[str] = frozenset()) -> Settings:
    """Checked values (flags.parse's) into their groups, each flag into the field it names."""
    groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for f in flags.FLAGS:
        groups[f.group][f.attribute] = checked[f.name]
    return Settings(**{name: GROUPS[name](**values) for name, values in groups.items()}, given=given)
