"""The CLI's run, step by step: settings checked, the dataset loaded, the Runtime started, the session run.

`run` is the whole of it: each step below is one function, and what a run starts once (secrets withdrawn,
sandboxes chosen, the local model, the run's own tools, the workers) is the Runtime (runtime.py), which the
session borrows. With --run_name alone, `existing_run` exports or reports on a run and starts nothing; with
--rescore, `rescore_run` checks a finished run's samples again and starts no model, key, tools or workers.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentbatch import dataset_formats, dataset_steps, run_tools, runtime, secrets_guard, settings
from agentbatch.budget import BudgetSettings
from agentbatch.dataset import Entry
from agentbatch.dataset_formats import DatasetFormat
from agentbatch.errors import FatalError
from agentbatch.model.client import ModelSettings
from agentbatch.run_dir.reader import RunReader
from agentbatch.runtime import Runtime
from agentbatch.sandboxes.base import owner_labels
from agentbatch.session import Session, SessionSettings, new_session_id
from agentbatch.settings import Settings
from agentbatch.work import RunConfig


@dataclass(frozen=True)
class Dataset:
    """The run's dataset: its format, and the entries of its valid rows (the format's prepare completes them)."""

    format: DatasetFormat
    entries: list[Entry]

    @property
    def images(self) -> bool:
        """Whether some entry names an image or a build (its backend, docker, is then checked at start)."""
        return any(e.image or e.build for e in self.entries)


def run(values: Mapping[str, Any]) -> int:
    """Check every flag, then run; returns the exit code."""
    s = settings.build(values)
    if s.run.rescore:
        return rescore_run(s)
    if s.run.dataset_file is None and s.output.asked:
        return existing_run(s)
    require_run_flags(s)
    data = load_dataset(s)
    with Runtime(s, images=data.images) as runtime:
        session = make_session(s, data, runtime)
        # Made before the session runs: local workers start now, while the runner is still one thread.
        return session.run(runtime.executor())


def require_run_flags(s: Settings) -> None:
    """The flags a run cannot do without (--help shows them as "required")."""
    if s.run.dataset_file is None:
        raise FatalError('--dataset_file is required: a JSONL file with one {"prompt": ...} per line')
    if s.run.batch_size is None:
        raise FatalError("--batch_size is required: how many samples go in each batch file")
    if s.run.run_name is None:
        raise FatalError("--run_name is required: output goes to data/<run_name>/")


def load_dataset(s: Settings) -> Dataset:
    """The entries of --dataset_file by the format that claims it, a warning per row it skips; FatalError when
    none is left, when the model runs other formats only, or when --require_pass has nothing to check."""
    path = s.run.dataset_file
    fmt = dataset_formats.format_of(path)
    entries, warnings = fmt.load(path, s.run.max_samples)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    if not entries:
        if os.path.isdir(path):
            raise FatalError(f"no runnable task in {path} (the warnings above say why)")
        raise FatalError(f'no valid entries in {path}: each line needs a JSON object with a "prompt" string')
    dataset_steps.refuse_other_formats(s.model.model, fmt)  # a model for one format's tasks only (--model=oracle)
    if s.quality.require_pass and not any(e.verify or e.answers or e.hooks is not None for e in entries):
        raise FatalError(
            f"--require_pass keeps only samples that pass their check, but no row of {path} has "
            'a "verify" or "answer" field; add checks to the rows or drop --require_pass'
        )
    return Dataset(fmt, entries)


def make_session(s: Settings, data: Dataset, runtime: Runtime) -> Session:
    """The dataset made ready, then the session with what it does at its end."""
    context = prepare_dataset(s, data, runtime)
    outputs = at_end(s, runtime.secrets) if s.output.asked else None
    return Session(
        session_settings(s, data, runtime, dataset_steps.at_end(data.format, data.entries, context, outputs))
    )


def prepare_dataset(s: Settings, data: Dataset, runtime: Runtime) -> dataset_steps.RunContext:
    """The format's steps before any sample: its own prepare, each entry's limits, every image built (as many at
    once as --sandbox_starts, else one per core), its ready step; the context its steps in the runner get."""
    context = dataset_steps.RunContext(runtime.run_dir, runtime.model)
    parallel = s.scale.sandbox_starts or os.cpu_count() or 1
    own = dataset_steps.prepare(data.format, data.entries, context, s.timeout_bounds(), runtime.cfg, parallel)
    runtime.add_toolsets(own)  # the entries' own (a task's MCP servers): in the run's tool set, offered to them alone
    return context


def session_settings(s: Settings, data: Dataset, runtime: Runtime, end: Callable[[int], int] | None) -> SessionSettings:
    """Everything the session needs besides its executor."""
    return SessionSettings(
        runtime.cfg,
        runtime.run_dir,
        data.entries,
        s.run.batch_size,
        runtime.distribution,
        seed=s.run.seed,
        resume=s.run.resume,
        samples_per_prompt=s.run.samples_per_prompt,
        dataset_file=s.run.dataset_file,
        session_id=runtime.session_id,
        sandbox_note=dataset_steps.sandbox_note(data.format, runtime.sandbox_note),
        budget=BudgetSettings(
            s.budget.budget_usd, s.budget.budget_tokens, s.limits.max_cost_per_prompt, s.limits.max_tokens_per_prompt
        ),
        progress_seconds=s.run.progress_seconds,
        slots=runtime.plan.slots,
        priced=runtime.priced,
        at_end=end,
    )


def at_end(s: Settings, secrets: tuple[str, ...]) -> Callable[[int], int]:
    """The exports and the report asked for with a run: written as its session ends, before it lets the run
    directory go."""

    def write(code: int) -> int:
        failed = False
        if s.output.export:
            from agentbatch.export import from_flags

            failed |= _failed_after(code, lambda: from_flags.after_session(s, secrets, code))
        if s.output.report or s.output.compare:
            from agentbatch.report import from_flags as report_flags

            failed |= _failed_after(code, lambda: report_flags.after_session(s, secrets, code))
        return code or (2 if failed else 0)

    return write


def _failed_after(code: int, write: Callable[[], Any]) -> bool:
    """Whether an export or report written after the session could not be: then one line says why, and the run's
    own exit code stands (2 only when the run itself succeeded: what was asked for is then what failed)."""
    try:
        write()
    except FatalError as e:
        print(f"error: {e} (the run itself ended with exit code {code})", file=sys.stderr)
        return True
    return False


def existing_run(s: Settings) -> int:
    """--run_name without a dataset: export it and/or write its report as it is now, and exit."""
    env = tuple(v for k, v in os.environ.items() if secrets_guard.looks_secret(k))
    key = s.model.api_key
    secrets = (*env, key) if key else env  # lines were redacted when written: again, to be sure
    if s.output.compare:
        from agentbatch.report import from_flags as report_flags

        report_flags.check(s)  # before anything is exported
    if s.output.export:
        from agentbatch.export import from_flags

        from_flags.export_only(s, secrets)
    if s.output.report or s.output.compare:
        from agentbatch.report import from_flags as report_flags

        report_flags.report_only(s, secrets)
    return 0


def rescore_run(s: Settings) -> int:
    """--rescore: the run's samples checked again against the dataset's checks as they are now (rescore.py): no
    model, no key, no tools, no workers; its sandboxes and time limits as a session's, its outputs after it."""
    from agentbatch import rescore

    require_rescore_flags(s)
    data = load_dataset(s)
    cfg, session_id = rescore_config(s, data)
    run_dir = s.run.run_dir
    model = RunReader(run_dir).checkpoint().get("model")  # the run's model: an oracle run's verdict is its own
    context = dataset_steps.RunContext(run_dir, model if isinstance(model, str) and model else s.model.model)
    parallel = s.scale.sandbox_starts or os.cpu_count() or 1
    dataset_steps.prepare(data.format, data.entries, context, s.timeout_bounds(), cfg, parallel)
    outputs = at_end(s, cfg.secrets) if s.output.asked else None
    return rescore.run(
        rescore.RescoreSettings(
            run_dir,
            data.entries,
            cfg,
            session_id,
            s.run.samples_per_prompt,
            s.scale.slots,
            dataset_steps.at_end(data.format, data.entries, context, outputs),
        )
    )


def require_rescore_flags(s: Settings) -> None:
    """What a rescore cannot do without, and what it does not do."""
    if s.run.dataset_file is None:
        raise FatalError("--rescore needs --dataset_file: the dataset whose checks the run's samples get again")
    if s.run.run_name is None:
        raise FatalError("--rescore needs --run_name: the finished run to check again")
    if s.run.resume:
        raise FatalError("--rescore checks the samples of a finished run again and runs none: drop --resume")


def rescore_config(s: Settings, data: Dataset) -> tuple[RunConfig, str]:
    """What a rescore's checks get (a RunConfig without a model or tools), and its session id (its sandboxes'
    owner): credentials withdrawn before any sandbox starts, the sandboxes chosen as a session's."""
    withdrawn = secrets_guard.withdraw_environment()
    key = s.model.api_key
    secrets = (*((key,) if key else ()), *withdrawn.values())
    sandbox, _note = runtime.choose_sandboxes(s, data.images)
    session_id = new_session_id()
    cfg = RunConfig(
        s.run.run_name,
        ModelSettings(s.model.model, s.model.base_url, ""),
        sandbox=dataclasses.replace(sandbox, starts=runtime.sandbox_starts(s.scale.sandbox_starts, 1)),
        check_timeout=s.limits.check_timeout,
        secrets=secrets,
        sandbox_labels=owner_labels(s.run.run_dir, session_id),
    )
    return cfg, session_id


def distributions_text(values: Mapping[str, Any]) -> str:
    """--list_distributions with a distributions file or the run's own tools: every distribution, checked."""
    t = settings.build(values).tools
    return run_tools.distribution_table(t.tools, t.mcp_config, t.distributions_file)
