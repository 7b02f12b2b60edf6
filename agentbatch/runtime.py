"""What a run starts once and every sample of it shares: the Runtime, a context manager that stops it all on leaving.

Entering it runs these steps in order, each a function of its own: the credentials withdrawn from the
environment (and the tool settings read with them), the sandboxes chosen (each backend's `prepare_run`), the
embedded model served (--model=local), the model's key found and the runner made unreadable, the run's own tools
(modules, MCP servers listed) and its distribution, the settings that name what the run has checked, every
secret redacted from the logs, the samples in flight laid out over worker processes, the pacing directory, the
model-call cache made ready (--cache), the staging directory of the samples' final states (--keep_final_state),
and the RunConfig every worker gets. The executor (its worker processes) is made at the first `executor()` call:
the CLI's session asks once the dataset's images are built, so workers fork while the runner is one thread.

The CLI's session uses one Runtime (launch.py); a Python caller running samples on demand keeps one open over
many sessions. Everything its workers get is the one frozen RunConfig (`cfg`), so another model for the same
workers is a RunConfig derived with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from contextlib import ExitStack, closing
from typing import Any

import agentbatch.flag_checks as check
import agentbatch.plugins as plugins
import agentbatch.process_guard as process_guard
import agentbatch.run_tools as run_tools
import agentbatch.secrets_guard as secrets_guard
from agentbatch.errors import FatalError
from agentbatch.executors import capacity
from agentbatch.executors.base import Executor
from agentbatch.model import cache
from agentbatch.model import registry as models
from agentbatch.model.client import ModelSettings, reports_cost
from agentbatch.run_dir.reader import RunReader
from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec, owner_labels
from agentbatch.sandboxes.choice import choose
from agentbatch.session import new_session_id
from agentbatch.settings import Settings
from agentbatch.tool_set import ToolSet
from agentbatch.tools import settings as tool_settings
from agentbatch.tools.settings import ToolSettings
from agentbatch.work import RunConfig
from toolset_distributions import Distribution

# Containers created at once per core by default: the engine's best parallelism (bench/RESULTS.md, (12)).
DEFAULT_STARTS_PER_CORE = 2


class Runtime:
    """Everything a run starts once (module docstring), from its settings; `images`: some row names an image."""

    cfg: RunConfig  # what every worker gets: the model, tools, sandbox, limits, secrets, the run's tool set
    distribution: Distribution  # the run's toolset distribution, its own toolsets checked
    plan: capacity.Plan  # samples in flight as worker processes × slots
    run_dir: str
    session_id: str  # the sandboxes' owner (their labels), and the session's id
    model: str  # the run's model ("local" for the embedded one)
    base_url: str  # where it is called (the embedded model's loopback address)
    sandbox_note: str  # the line that says which sandbox runs the samples
    secrets: tuple[str, ...]  # every credential of the run, redacted from everything written
    priced: bool  # costs are known: prices given, or an endpoint that reports them

    def __init__(self, settings: Settings, images: bool = False):
        self.settings = settings
        self.images = images
        self._stack = ExitStack()
        self._executor: Executor | None = None

    def __enter__(self) -> Runtime:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()  # the executor first (its workers), then the pacing directory, then the local model

    def _start(self) -> None:
        s = self.settings
        withdrawn, tools = withdraw_secrets(s)
        sandbox, self.sandbox_note = choose_sandboxes(s, self.images)
        self.base_url, self.model = self._serve_model()
        key = model_key(s, self.base_url, self.model)
        guard_process(key)
        self.session_id = new_session_id()
        # A Python caller's rollouts may have no run directory (rollouts.py): nothing is written then, and its
        # sandboxes are labelled with a directory no run has, so no session ever reaps them but its own.
        self.run_dir = s.run.run_dir if s.run.run_name is not None else ""
        owner = self.run_dir or os.path.join(tempfile.gettempdir(), f"br-rollouts-{self.session_id}")
        labels = owner_labels(owner, self.session_id)
        spec = SandboxSpec(sandbox, run_name=self.run_name, labels=dict(labels))  # the MCP servers' sandboxes
        own_tools, self.distribution = prepare_tools(s, spec)
        check_outputs(s, own_tools, self.run_dir)
        self.secrets = (key, *withdrawn.values(), *tools.secrets(), *own_tools.secrets())
        secrets_guard.redact_logs(secrets_guard.Redactor(self.secrets))
        self.plan = layout(s.scale.num_workers, s.scale.concurrency, s.scale.ray_address)
        pacing_dir = self._stack.enter_context(tempfile.TemporaryDirectory(prefix="br-pacing-"))
        model = model_settings(s, self.model, self.base_url, key, self.plan.processes, pacing_dir)
        sandbox = dataclasses.replace(sandbox, starts=sandbox_starts(s.scale.sandbox_starts, self.plan.processes))
        states = self._final_state_dir()
        self.cfg = run_config(s, model, tools, sandbox, own_tools, labels, self.secrets, states)
        self.cfg = dataclasses.replace(self.cfg, run_name=self.run_name)
        self.priced = s.budget.priced or reports_cost(self.base_url)

    @property
    def run_name(self) -> str:
        """--run_name; "rollouts" for a Python caller's rollouts without a run directory."""
        return self.settings.run.run_name or "rollouts"

    def _serve_model(self) -> tuple[str, str]:
        """(base_url, model): the embedded model served on loopback until the Runtime ends, else the flags'."""
        m = self.settings.model
        if not m.local:
            return m.base_url, m.model  # checked with the flags
        from agentbatch.model import local_server

        return self._stack.enter_context(
            local_server.serve(m.local_model_path, verbose=self.settings.run.verbose)
        ), "local"

    def _final_state_dir(self) -> str | None:
        """--keep_final_state: where the workers stage each sample's final state, outside the run directory (the
        session moves each into it as it records the sample's line), until the Runtime ends."""
        if not self.settings.sandbox.keep_final_state:
            return None
        return self._stack.enter_context(tempfile.TemporaryDirectory(prefix="br-state-"))

    def add_toolsets(self, own: dict[str, tuple[tuple[str, ...], str]]) -> None:
        """Toolsets of the dataset's entries' own (name -> its tools, where they come from; a task's MCP servers,
        found by its format's ready step) added to the run's tool set, which tools.json and every line's tool_stats
        then hold. Before the executor starts: its workers get `cfg` as it is then."""
        if not own:
            return
        if self._executor is not None:
            raise FatalError(
                f"the dataset's own toolsets ({', '.join(own)}) join a run before its workers start: "
                "this Runtime's have; use a new Runtime for this dataset"
            )
        self.cfg = dataclasses.replace(self.cfg, tool_set=self.cfg.tool_set.with_toolsets(own))

    def executor(self) -> Executor:
        """The run's executor, its workers started at the first call and stopped when the Runtime ends."""
        if self._executor is None:
            made = make_executor(self.cfg, self.plan, self.settings.scale.ray_address)
            self._executor = self._stack.enter_context(closing(made))
        return self._executor


def withdraw_secrets(s: Settings) -> tuple[dict[str, str], ToolSettings]:
    """Before anything is started, no child process may inherit a credential (secrets_guard): the withdrawn
    variables, and the tool settings read from the flags and the environment as it was."""
    withdrawn = secrets_guard.withdraw_environment()
    t = s.tools
    tools = tool_settings.from_environment(
        {**os.environ, **withdrawn},
        command_timeout=t.command_timeout,
        request_timeout=s.model.request_timeout,
        allow_private_urls=t.allow_private_urls or s.model.local,  # the local model's server is on loopback
        vision_model=t.vision_model,
        image_model=t.image_model,
        image_base_url=t.image_base_url,
        moa_models=t.moa_models,
        moa_aggregator=t.moa_aggregator,
    )
    return withdrawn, tools


def choose_sandboxes(s: Settings, images: bool) -> tuple[SandboxSettings, str]:
    """Chosen once, here (bwrap probed), with the one-line note that says which, printed as the session starts."""
    return choose(s.sandbox.sandbox, os.environ, s.sandbox.settings(), images=images)


def model_key(s: Settings, base_url: str, model: str) -> str:
    """The model's API key (the flag's, else the environment's; FatalError if a hosted endpoint needs one), once
    the run's spend can be known where a budget needs it."""
    key = check.api_key(s.model.api_key, base_url, needed=not s.model.local and models.needs_endpoint(model))
    if s.budget.budget_usd is not None and not s.budget.priced and not reports_cost(base_url):
        raise FatalError(
            "--budget_usd needs costs: this endpoint does not report them (OpenRouter does); "
            "give --price_input and --price_output (USD per million tokens)"
        )
    return key


def guard_process(key: str) -> None:
    """A sandboxed command running as our user could read the key from /proc/<runner>/cmdline or environ, or from
    our memory: masked there, then the process is made unreadable (after: masking writes to it)."""
    secrets_guard.hide_from_proc([key])
    process_guard.forbid_inspection()


def prepare_tools(s: Settings, sandbox: SandboxSpec) -> tuple[ToolSet, Distribution]:
    """The run's own tools (modules; MCP servers, whose tool lists are read now) and its distribution."""
    t = s.tools
    return run_tools.prepare(
        t.tools, t.mcp_config, t.distributions_file, t.distribution, t.command_timeout, secrets_guard.getenv, sandbox
    )


def check_outputs(s: Settings, tool_set: ToolSet, run_dir: str) -> None:
    """The flags of what is written after the session, checked before any model call (not once the run is paid):
    the runs --compare names exist, and --export_toolsets names toolsets of the run (this session's, or an
    earlier one's in tools.json)."""
    if s.output.compare:
        from agentbatch.report import from_flags as report_flags

        report_flags.check(s)
    if s.output.export and s.output.export_toolsets:
        recorded = RunReader(run_dir).recorded_tools()
        known = tool_set.union(recorded).toolsets if recorded is not None else tool_set.toolsets
        unknown = [name for name in s.output.export_toolsets if name not in known]
        if unknown:
            raise FatalError(
                f"--export_toolsets: this run has no toolset {check.shown(unknown[0])}; its toolsets: "
                f"{', '.join(known)}"
            )


def model_settings(s: Settings, model: str, base_url: str, key: str, workers: int, pacing_dir: str) -> ModelSettings:
    """How every worker calls the run's model: the flags, the endpoint found, and the workers pacing together."""
    m = s.model
    return ModelSettings(
        model=model,
        base_url=base_url,
        api_key=key,
        request_timeout=m.request_timeout,
        max_retries=m.max_retries,
        providers_allowed=m.providers_allowed,
        providers_ignored=m.providers_ignored,
        providers_order=m.providers_order,
        provider_sort=m.provider_sort,
        reasoning_effort=m.reasoning_effort,
        reasoning_disabled=m.reasoning_disabled,
        max_tokens=m.max_tokens,
        workers=workers,
        pacing_dir=pacing_dir,
        logprobs=m.logprobs,
        cache=model_cache(s, base_url),
        token_ids=m.token_ids,
        tokenizer=m.tokenizer or default_tokenizer(s, model),
        policy_version=m.policy_version,
    )


def model_cache(s: Settings, base_url: str) -> cache.CacheSettings | None:
    """--cache: the run's model-call cache (model/cache.py), its store made ready before any model call; else None.
    The embedded model's endpoint is named by its file, whatever port it is served on."""
    m = s.model
    if not m.cache:
        return None
    gguf = None
    if m.local:
        from agentbatch.model import local_server

        gguf = local_server.resolve_model(m.local_model_path)
    return cache.for_run(m.cache_dir, m.cache_expiry, m.cache_size, s.run.seed, base_url, gguf)


def default_tokenizer(s: Settings, model: str) -> str | None:
    """Whose chat template retokenizes calls sent without ids: the model's name, the embedded model's GGUF file."""
    if not s.model.token_ids:
        return None
    if s.model.local:
        from agentbatch.model import local_server

        return local_server.resolve_model(s.model.local_model_path)
    return model


def run_config(
    s: Settings,
    model: ModelSettings,
    tools: ToolSettings,
    sandbox: SandboxSettings,
    tool_set: ToolSet,
    labels: dict[str, str],
    secrets: tuple[str, ...],
    final_state_dir: str | None = None,
) -> RunConfig:
    """Everything a worker needs to run samples."""
    return RunConfig(
        run_name=s.run.run_name,
        model=model,
        tools=tools,
        sandbox=sandbox,
        max_turns=s.limits.max_turns,
        limits=s.limits.prompt_limits(),
        prices=s.budget.prices(),
        system_prompt=s.model.ephemeral_system_prompt,
        prefill=s.model.prefill_messages,
        require_reasoning=s.quality.require_reasoning,
        require_pass=s.quality.require_pass,
        check_timeout=s.limits.check_timeout,
        verbose=s.run.verbose,
        log_prefix_chars=s.run.log_prefix_chars,
        secrets=secrets,
        plugins=plugins.loaded(),
        tool_set=tool_set,
        sandbox_labels=labels,
        keep_final_state=s.sandbox.keep_final_state,
        final_state_dir=final_state_dir,
    )


def sandbox_starts(total: int | None, processes: int) -> int:
    """Each worker process's share of the sandboxes created at once over the run (the default sized to the machine)."""
    total = total or DEFAULT_STARTS_PER_CORE * (os.cpu_count() or 1)
    return max(1, -(-total // processes))


def layout(num_workers: int, concurrency: int | None, ray_address: str | None) -> capacity.Plan:
    """Worker processes × slots for `concurrency` (else `num_workers`) samples in flight, one per slot."""
    slots = concurrency or num_workers
    if ray_address:
        # A cluster has more cores than this machine: actors of SLOTS_PER_PROCESS threads, spread over it.
        return capacity.plan(slots, cores=capacity.MAX_PROCESSES)
    plan = capacity.plan(slots)
    capacity.reserve(plan)
    return plan


def make_executor(cfg: RunConfig, plan: capacity.Plan, ray_address: str | None) -> Executor:
    """The executor running `plan`: its processes (Ray actors on a cluster) of threads, one sample at a time each."""
    if ray_address:
        from agentbatch.executors.ray_actors import RayExecutor

        return RayExecutor(cfg, ray_address, plan.processes, plan.threads)
    from agentbatch.executors.processes import LocalExecutor

    return LocalExecutor(cfg, plan.processes, plan.threads, plan.slots)
