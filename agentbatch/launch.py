"""From checked flags to a running session: the dataset, the settings, the local model, the executor."""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from typing import Any

from agentbatch import flag_checks as check
from agentbatch import flags, sandboxes, secrets_guard
from agentbatch.dataset import load_entries
from agentbatch.errors import FatalError
from agentbatch.executors.base import Executor, threads_per_worker
from agentbatch.model.client import ModelSettings
from agentbatch.prompt_runner import RunConfig
from agentbatch.run_files import RunFiles
from agentbatch.sandboxes.base import SandboxSettings
from agentbatch.session import Session
from agentbatch.tools import settings as tool_settings


def run(raw: dict[str, Any]) -> int:
    """Check every flag, then run; returns the exit code."""
    f = flags.parse(raw)
    if f["dataset_file"] is None:
        raise FatalError('--dataset_file is required: a JSONL file with one {"prompt": ...} per line')
    if f["batch_size"] is None:
        raise FatalError("--batch_size is required: how many prompts go in each batch file")
    if f["run_name"] is None:
        raise FatalError("--run_name is required: output goes to data/<run_name>/")
    local = f["model"] == "local" or f["base_url"] == "local"

    entries, warnings = load_entries(f["dataset_file"], f["max_samples"])
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not entries:
        raise FatalError(
            f'no valid entries in {f["dataset_file"]}: each line needs a JSON object with a "prompt" string'
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
        key = check.api_key(f["api_key"], base_url, needed=not local)
        # A sandboxed command running as our user could read the key from /proc/<runner>/cmdline or environ.
        secrets_guard.hide_from_proc([key])
        cfg = RunConfig(
            run_name=f["run_name"],
            model=ModelSettings(
                model=model,
                base_url=base_url,
                api_key=key,
                request_timeout=f["request_timeout"],
                max_retries=f["max_retries"],
                providers_allowed=f["providers_allowed"],
                providers_ignored=f["providers_ignored"],
                providers_order=f["providers_order"],
                provider_sort=f["provider_sort"],
                reasoning_effort=f["reasoning_effort"],
                reasoning_disabled=f["reasoning_disabled"],
            ),
            tools=tools,
            sandbox=SandboxSettings(
                kind=sandbox_kind,
                docker_image=f["docker_image"],
                memory=f["docker_memory"],
                cpus=f["docker_cpus"],
                pids=f["docker_pids"],
                network=f["sandbox_network"],
                processes=f["sandbox_processes"],
                memory_bytes=f["sandbox_memory"],
                file_size_bytes=f["sandbox_file_size"],
                cpu_seconds=f["sandbox_cpu_seconds"],
            ),
            max_turns=f["max_turns"],
            system_prompt=f["ephemeral_system_prompt"],
            prefill=f["prefill_messages_file"] or [],
            require_reasoning=f["require_reasoning"],
            verbose=f["verbose"],
            log_prefix_chars=f["log_prefix_chars"],
        )
        secrets = (key, *withdrawn.values(), *tools.secrets())
        files = RunFiles(os.path.join(f["output_dir"], f["run_name"]), secrets=secrets)
        session = Session(cfg, files, entries, f["batch_size"], f["distribution"], f["seed"], f["resume"])
        session.dataset_file = f["dataset_file"]
        session.sandbox_note = sandbox_note
        return session.run(executor(cfg, f["num_workers"], f["concurrency"], f["ray_address"]))


def executor(cfg: RunConfig, num_workers: int, concurrency: int | None, ray_address: str | None) -> Executor:
    threads = threads_per_worker(concurrency, num_workers)
    if ray_address:
        from agentbatch.executors.ray_actors import RayExecutor

        return RayExecutor(cfg, ray_address, num_workers, threads)
    from agentbatch.executors.processes import LocalExecutor

    return LocalExecutor(cfg, num_workers, threads)
