"""From checked flags to a running session: the dataset, the settings, the local model, the executor."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from contextlib import ExitStack, closing
from typing import Any, TypeVar

from agentbatch import dataset_formats, flags, plugins, process_guard, sandboxes, secrets_guard
from agentbatch import flag_checks as check
from agentbatch.budget import BudgetSettings
from agentbatch.errors import FatalError
from agentbatch.executors import capacity
from agentbatch.executors.base import Executor
from agentbatch.limits import PromptLimits
from agentbatch.model import registry as models
from agentbatch.model.client import ModelSettings, reports_cost
from agentbatch.model.usage import Prices
from agentbatch.prompt_runner import RunConfig
from agentbatch.run_files import RunFiles
from agentbatch.sandboxes.base import SandboxSettings, owner_labels
from agentbatch.session import Session, new_session_id
from agentbatch.tools import settings as tool_settings

T = TypeVar("T")
# Containers created at once per core by default: the engine's best parallelism (bench/RESULTS.md, (12)).
DEFAULT_STARTS_PER_CORE = 2


def run(raw: dict[str, Any]) -> int:
    """Check every flag, then run; returns the exit code."""
    f = flags.parse(raw)
    plugins.load(f["plugins"])  # before anything asks for a tool, a backend, a dataset format or a model
    if f["export"] and f["dataset_file"] is None:
        from agentbatch.export import from_flags

        return from_flags.export_only(f)
    if f["dataset_file"] is None:
        raise FatalError('--dataset_file is required: a JSONL file with one {"prompt": ...} per line')
    if f["batch_size"] is None:
        raise FatalError("--batch_size is required: how many prompts go in each batch file")
    if f["run_name"] is None:
        raise FatalError("--run_name is required: output goes to data/<run_name>/")
    local = f["model"] == "local" or f["base_url"] == "local"

    entries, warnings = dataset_formats.load(f["dataset_file"], f["max_samples"])
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not entries:
        raise FatalError(
            f'no valid entries in {f["dataset_file"]}: each line needs a JSON object with a "prompt" string'
        )
    if f["require_pass"] and not any(e.verify or e.answers for e in entries):
        raise FatalError(
            f"--require_pass keeps only samples that pass their check, but no row of {f['dataset_file']} has "
            'a "verify" or "answer" field; add checks to the rows or drop --require_pass'
        )

    # Before anything is started: no child process inherits a credential (secrets_guard).
    withdrawn = secrets_guard.withdraw_environment()
    env = {**os.environ, **withdrawn}
    tools = tool_settings.from_environment(
        env,
        command_timeout=f["command_timeout"],
        request_timeout=f["request_timeout"],
        allow_private_urls=f["allow_private_urls"] or local,  # the local model's server is on loopback
        vision_model=f["vision_model"],
        image_model=f["image_model"],
        image_base_url=f["image_base_url"],
        moa_models=f["moa_models"],
        moa_aggregator=f["moa_aggregator"],
    )
    # Probed once, here: bwrap where it works, else local (a one-line note says which, printed as the run starts).
    sandbox_kind, sandbox_note = sandboxes.choose(f["sandbox"], network=f["sandbox_network"])
    with ExitStack() as stack:
        if local:
            from agentbatch.model import local_server

            base_url = stack.enter_context(local_server.serve(f["local_model_path"], verbose=f["verbose"]))
            model = "local"
        else:
            base_url, model = check.base_url(f["base_url"]), f["model"]
        key = check.api_key(f["api_key"], base_url, needed=not local and models.needs_endpoint(model))
        priced = f["price_input"] is not None or f["price_output"] is not None
        if f["budget_usd"] is not None and not priced and not reports_cost(base_url):
            raise FatalError(
                "--budget_usd needs costs: this endpoint does not report them (OpenRouter does); "
                "give --price_input and --price_output (USD per million tokens)"
            )
        # A sandboxed command running as our user could read the key from /proc/<runner>/cmdline or environ,
        # or from our memory: masked there, then the process is made unreadable (after: masking writes to it).
        secrets_guard.hide_from_proc([key])
        process_guard.forbid_inspection()
        secrets = (key, *withdrawn.values(), *tools.secrets())
        secrets_guard.redact_logs(secrets_guard.Redactor(secrets))
        run_dir = os.path.join(f["output_dir"], f["run_name"])
        session_id = new_session_id()
        plan = layout(f["num_workers"], f["concurrency"], f["ray_address"])
        cfg = _from_flags(
            RunConfig,
            f,
            model=_from_flags(
                ModelSettings,
                f,
                model=model,
                base_url=base_url,
                api_key=key,
                workers=plan.processes,
                pacing_dir=stack.enter_context(tempfile.TemporaryDirectory(prefix="br-pacing-")),
            ),
            tools=tools,
            sandbox=SandboxSettings(
                kind=sandbox_kind,
                docker_image=f["docker_image"],
                memory=f["docker_memory"],
                cpus=f["docker_cpus"],
                pids=f["docker_pids"],
                starts=sandbox_starts(f["sandbox_starts"], plan.processes),
                network=f["sandbox_network"],
                processes=f["sandbox_processes"],
                memory_bytes=f["sandbox_memory"],
                file_size_bytes=f["sandbox_file_size"],
                cpu_seconds=f["sandbox_cpu_seconds"],
            ),
            limits=PromptLimits(f["prompt_timeout"], f["max_tokens_per_prompt"], f["max_cost_per_prompt"]),
            prices=Prices(f["price_input"] or 0.0, f["price_output"] or 0.0),
            system_prompt=f["ephemeral_system_prompt"],
            prefill=f["prefill_messages_file"] or [],
            secrets=secrets,
            plugins=plugins.loaded(),
            sandbox_labels=owner_labels(run_dir, session_id),
        )
        files = RunFiles(run_dir, secrets=secrets)
        session = Session(
            cfg, files, entries, f["batch_size"], f["distribution"], f["seed"], f["resume"], f["samples_per_prompt"]
        )
        session.dataset_file = f["dataset_file"]
        session.session_id = session_id
        session.sandbox_note = sandbox_note
        session.budget_settings = BudgetSettings(
            f["budget_usd"], f["budget_tokens"], f["max_cost_per_prompt"], f["max_tokens_per_prompt"]
        )
        session.progress_seconds = f["progress_seconds"]
        session.priced = priced or reports_cost(base_url)
        session.slots = plan.sessions
        # Made before the session runs: local workers start now, while the runner is still one thread.
        ex = stack.enter_context(closing(executor(cfg, plan, f["ray_address"])))
        code = session.run(ex)
    if f["export"]:
        from agentbatch.export import from_flags

        return from_flags.after_session(f, secrets, code)
    return code


def _from_flags(cls: type[T], f: dict[str, Any], **given: Any) -> T:
    """A settings dataclass: every field a flag of the same name sets, then the values given."""
    names = {field.name for field in dataclasses.fields(cls)} - set(given)
    return cls(**{name: f[name] for name in names if name in f}, **given)


def sandbox_starts(total: int | None, processes: int) -> int:
    """Each worker process's share of the sandboxes created at once over the run (the default sized to the machine)."""
    total = total or DEFAULT_STARTS_PER_CORE * (os.cpu_count() or 1)
    return max(1, -(-total // processes))


def layout(num_workers: int, concurrency: int | None, ray_address: str | None) -> capacity.Plan:
    """Processes × threads for `concurrency` (else `num_workers`) sessions: a worker is one session."""
    sessions = concurrency or num_workers
    if ray_address:
        # A cluster has more cores than this machine: actors of SESSIONS_PER_PROCESS threads, spread over it.
        return capacity.plan(sessions, cores=capacity.MAX_PROCESSES)
    plan = capacity.plan(sessions)
    capacity.reserve(plan)
    return plan


def executor(cfg: RunConfig, plan: capacity.Plan, ray_address: str | None) -> Executor:
    """The executor running `plan`: its processes (Ray actors on a cluster) of its threads, one session each."""
    if ray_address:
        from agentbatch.executors.ray_actors import RayExecutor

        return RayExecutor(cfg, ray_address, plan.processes, plan.threads)
    from agentbatch.executors.processes import LocalExecutor

    return LocalExecutor(cfg, plan.processes, plan.threads, plan.sessions)
