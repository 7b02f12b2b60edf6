"""Every command-line flag, declared once: name, default, help and check.

The CLI's signature and `--help` (batch_runner.main), the checks run before anything starts, and the
reference page docs/flags.md all come from FLAGS; tests/test_flags.py holds the page to it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import agentbatch.flag_checks as check
from agentbatch.errors import FatalError
from agentbatch.export import check_formats
from agentbatch.model import numbers

Check = Callable[[str, Any], Any]
# Samples in flight (and sandboxes started at once): capacity.py finds how many this machine can hold.
MAX_SAMPLES_IN_FLIGHT = 1_000_000
MAX_PIDS = 4_194_304  # Linux's most process ids (pid_max)


def _as_is(name: str, value: Any) -> Any:
    return value


def _text(name: str, value: Any) -> str | None:
    return None if value is None else str(value)


def _optional(fn: Check) -> Check:
    return lambda name, value: None if value is None else fn(name, value)


def _int(minimum: int, maximum: int = 2**31 - 1) -> Check:
    return check.whole(minimum, maximum)


def _distribution(name: str, value: Any) -> str:
    """The name; which distributions exist is known once --distributions_file is read (tool_set.distributions)."""
    text = str(value).strip()
    if not text:
        raise FatalError(f"--{name} is empty; see --list_distributions")
    return text


def _seed(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise FatalError(f"--{name} must be a whole number, got {check.shown(value)}")
    return value


@dataclass(frozen=True)
class Flag:
    """One command-line flag. `text` flags keep their value exactly as typed (Fire would parse "123" as 123)."""

    name: str
    default: Any
    help: str
    check: Check = _as_is
    text: bool = False
    shown_default: str | None = None  # how the README shows the default, when not the literal value
    kind: type | None = None  # the value's type for --help, when neither `text` nor the default tells it
    # Where its checked value goes in the typed settings (settings.py): `Settings.<group>.<field>`, the field named
    # as the flag unless `field` says otherwise. tests/test_settings.py holds every flag to exactly one field.
    group: str = ""
    field: str | None = None

    @property
    def attribute(self) -> str:
        """Its field's name in its group of the settings."""
        return self.field or self.name

    def annotation(self) -> Any:
        kind = str if self.text else self.kind or type(self.default)
        return kind | None if self.default is None else kind

    def readme_default(self) -> str:
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "none"
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


def _t(
    name: str,
    default: Any,
    help: str,
    check: Check = _text,
    shown: str | None = None,
    group: str = "",
    field: str | None = None,
) -> Flag:
    return Flag(name, default, help, check, text=True, shown_default=shown, group=group, field=field)


FLAGS: tuple[Flag, ...] = (
    _t(
        "dataset_file",
        None,
        'JSONL file, one {"prompt": ...} object per line (see "The dataset")',
        check.input_path,
        shown="required",
        group="run",
    ),
    Flag(
        "batch_size",
        None,
        "samples per batch file",
        _optional(_int(1, 10**9)),
        shown_default="required",
        kind=int,
        group="run",
    ),
    _t(
        "run_name",
        None,
        "output goes to <output_dir>/<run_name>/",
        _optional(check.run_name),
        shown="required",
        group="run",
    ),
    _t("distribution", "default", "toolset distribution, see --list_distributions", _distribution, group="tools"),
    Flag(
        "tools",
        None,
        "your own tool modules: Python modules or .py files (comma-separated) of `@tool` functions, each module a "
        "toolset (see docs/tools.md)",
        check.name_list,
        kind=str,
        group="tools",
    ),
    _t(
        "mcp_config",
        None,
        "an mcp.json of MCP servers (stdio or Streamable HTTP) whose tools the run offers, each server a toolset "
        "(see docs/tools.md)",
        check.input_file,
        group="tools",
    ),
    _t(
        "distributions_file",
        None,
        "a JSON or YAML file of distributions (toolset: percent) added to the built-ins, or replacing one of the "
        "same name (see docs/tools.md)",
        check.input_file,
        group="tools",
    ),
    _t(
        "model",
        "anthropic/claude-sonnet-4.6",
        "model name at the endpoint; `local` runs the embedded model offline",
        group="model",
    ),
    _t("base_url", "https://openrouter.ai/api/v1", "any OpenAI-compatible endpoint", check.base_url, group="model"),
    _t(
        "api_key",
        None,
        "else OPENROUTER_API_KEY, else OPENAI_API_KEY; required for openrouter.ai and api.openai.com",
        lambda n, v: check.header_safe(f"--{n}", v),
        shown="env",
        group="model",
    ),
    Flag("max_turns", 10, "model calls per sample", _int(1, 1_000_000), group="limits"),
    Flag(
        "max_tokens",
        None,
        "most tokens a model may write per call (the request's `max_tokens`)",
        _optional(_int(1)),
        kind=int,
        group="model",
    ),
    Flag(
        "max_tokens_per_prompt",
        None,
        "tokens (prompt + completion, all calls) after which a sample makes no further model call: `partial`, stop_reason `tokens`",
        _optional(_int(1, numbers.MAX_COUNT)),
        kind=int,
        group="limits",
    ),
    Flag(
        "max_cost_per_prompt",
        None,
        "USD after which a sample makes no further model call: `partial`, stop_reason `cost`",
        _optional(check.usd),
        kind=float,
        group="limits",
    ),
    Flag(
        "prompt_timeout",
        None,
        "seconds a sample may run, tools included; its model call or command is cut then: `partial`, stop_reason `time`",
        _optional(check.seconds),
        kind=float,
        group="limits",
    ),
    Flag(
        "price_input",
        None,
        "USD per million prompt tokens, for the cost of calls whose endpoint reports none",
        _optional(check.price),
        kind=float,
        group="budget",
    ),
    Flag(
        "price_output",
        None,
        "USD per million completion tokens, for the cost of calls whose endpoint reports none",
        _optional(check.price),
        kind=float,
        group="budget",
    ),
    Flag(
        "budget_usd",
        None,
        'spend of the whole run, earlier sessions included, past which no new sample starts (see "Limits, cost and budget")',
        _optional(check.usd),
        kind=float,
        group="budget",
    ),
    Flag(
        "budget_tokens",
        None,
        "tokens of the whole run, earlier sessions included, past which no new sample starts",
        _optional(_int(1, 10**15)),
        kind=int,
        group="budget",
    ),
    Flag(
        "num_workers",
        4,
        "samples in flight, one per slot (a thread); the slots share worker processes, at most one per core "
        "unless the open-file limit asks for more (see Scale)",
        _int(1, MAX_SAMPLES_IN_FLIGHT),
        group="scale",
    ),
    Flag(
        "concurrency",
        None,
        "samples in flight, when given: overrides --num_workers (1,024 work on 2 cores); model calls are paced "
        "below it when the endpoint answers 429 or is overloaded",
        _optional(_int(1, MAX_SAMPLES_IN_FLIGHT)),
        shown_default="num_workers",
        kind=int,
        group="scale",
    ),
    Flag(
        "sandbox_starts",
        None,
        "sandboxes being created at once over all workers (container starts are paced apart from the samples)",
        _optional(_int(1, MAX_SAMPLES_IN_FLIGHT)),
        shown_default="2 × cores",
        kind=int,
        group="scale",
    ),
    Flag(
        "resume",
        False,
        "continue the run: done and discarded samples are skipped, failed ones re-run",
        check.boolean,
        group="run",
    ),
    Flag("verbose", False, "log every sample; tracebacks on fatal errors", check.boolean, group="run"),
    Flag(
        "progress_seconds",
        10.0,
        "seconds between progress lines when stderr is not a terminal (a terminal gets a live line)",
        check.seconds,
        group="run",
    ),
    Flag(
        "max_samples",
        None,
        "only the first N valid dataset entries",
        _optional(_int(1, 10**12)),
        shown_default="all",
        kind=int,
        group="run",
    ),
    Flag(
        "providers_allowed",
        None,
        "OpenRouter `provider.only`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    Flag(
        "providers_ignored",
        None,
        "OpenRouter `provider.ignore`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    Flag(
        "providers_order",
        None,
        "OpenRouter `provider.order`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    _t(
        "provider_sort",
        None,
        "OpenRouter `provider.sort`: price, throughput or latency",
        check.provider_sort,
        group="model",
    ),
    _t(
        "reasoning_effort",
        None,
        "none, minimal, low, medium, high, xhigh, max or ultra: sends `reasoning: {enabled: true, effort}`",
        check.reasoning_effort,
        group="model",
    ),
    Flag(
        "reasoning_disabled",
        False,
        'ask the model not to reason: sends `reasoning: {effort: "none"}`',
        check.boolean,
        group="model",
    ),
    _t("ephemeral_system_prompt", None, "system prompt sent with every call, never saved", group="model"),
    Flag("log_prefix_chars", 100, "length of prompt previews in --verbose logs", _int(0, 1_000_000), group="run"),
    _t(
        "prefill_messages_file",
        None,
        "JSON array of {role, content} sent before every prompt, never saved",
        check.prefill_messages,
        group="model",
        field="prefill_messages",
    ),
    Flag("list_distributions", False, "print every distribution and exit", check.boolean, group="run"),
    Flag(
        "require_reasoning",
        True,
        "discard samples without any reasoning; false for models that never reason",
        check.boolean,
        group="quality",
    ),
    Flag(
        "samples_per_prompt",
        1,
        "rollouts of each prompt, each in its own sandbox (`sample_index` 0..N-1); pass@k for k up to N",
        _int(1, 100_000),
        group="run",
    ),
    Flag(
        "require_pass",
        False,
        'discard samples whose check did not pass (rows need `verify` or `answer`, see "Verified outcomes")',
        check.boolean,
        group="quality",
    ),
    Flag("check_timeout", 300.0, "seconds a row's `setup` or `verify` command may run", check.seconds, group="limits"),
    Flag(
        "keep_final_state",
        False,
        "keep each sample's sandbox as its agent left it (its work directory, or what changed in its container) in "
        "<run>/final_state/, so that --rescore can run its check again (see docs/replay.md)",
        check.boolean,
        group="sandbox",
    ),
    Flag(
        "rescore",
        False,
        "check every sample of the finished --run_name again against --dataset_file's checks as they are now, "
        "with no model call: `answer` against the recorded last message, `verify` and a Harbor task's tests in a "
        "fresh sandbox holding the sample's kept final state (see docs/replay.md)",
        check.boolean,
        group="run",
    ),
    Flag(
        "timeout_multiplier",
        1.0,
        "scales each Harbor task's own agent, verifier and build timeouts (slow machines)",
        check.number(0, 100, "a factor", above=True),
        group="limits",
    ),
    Flag(
        "logprobs",
        False,
        "ask for token log probabilities and store them with each assistant turn",
        check.boolean,
        group="model",
    ),
    Flag(
        "token_ids",
        False,
        "ask every model call for the token ids it saw and sampled and record the sample's `tokens` "
        "(ids, mask, logprobs: docs/output.md); where the endpoint sends none they are retokenized",
        check.boolean,
        group="model",
    ),
    _t(
        "tokenizer",
        None,
        "with --token_ids, the Hugging Face tokenizer (name or directory) whose chat template retokenizes the calls "
        "of an endpoint that sends no ids",
        shown="the model's name",
        group="model",
    ),
    _t(
        "policy_version",
        None,
        "a label of the policy the model serves, recorded on every sample (its line's `policy_version`) and on "
        "every model call of its `tokens` (docs/rollouts.md)",
        check.label,
        group="model",
    ),
    Flag("seed", None, "reproducible toolset sampling, whatever the scheduling", _seed, kind=int, group="run"),
    Flag(
        "cache",
        False,
        "answer a model call from the model-call cache when the same request was made before, and store every "
        "reply; a cached call costs nothing and counts in `usage.cached_calls` (see docs/replay.md)",
        check.boolean,
        group="model",
    ),
    _t(
        "cache_dir",
        None,
        "the model-call cache's directory, shared by every run that names it (`batch-runner cache --stats` shows it)",
        shown="`$XDG_CACHE_HOME/batch-runner/model-calls`, else `~/.cache/...`",
        group="model",
    ),
    _t(
        "cache_expiry",
        "1W",
        "how long a stored reply is used, in Inspect's spelling: a whole number and s, m, h, D, W, M or Y "
        "(1D: a day), or never",
        check.expiry,
        group="model",
    ),
    _t(
        "cache_size",
        "10g",
        "the model-call cache's bound: past it the least recently used replies are removed",
        check.size("1m"),
        group="model",
    ),
    _t(
        "sandbox",
        None,
        "bwrap, local or docker (see Sandboxes); rows with an image always use docker",
        check.sandbox_kind,
        shown="`TERMINAL_ENV`, else bwrap if it works here, else local",
        group="sandbox",
    ),
    _t(
        "sandbox_network",
        "on",
        "`none`: bwrap and docker sandboxes get no network (local cannot)",
        check.network,
        group="sandbox",
    ),
    _t(
        "sandbox_memory",
        "1g",
        "bwrap: data size (heap, private mappings) of each process",
        check.size("16m"),
        group="sandbox",
    ),
    Flag("sandbox_processes", 256, "bwrap: processes of one command at once", _int(1, MAX_PIDS), group="sandbox"),
    _t("sandbox_file_size", "1g", "bwrap: largest file a command may write", check.size("1m"), group="sandbox"),
    Flag(
        "sandbox_cpu_seconds",
        600,
        "bwrap: CPU seconds of each process",
        _int(1, int(check.MAX_SECONDS)),
        group="sandbox",
    ),
    _t("docker_image", "python:3.11-slim", "default image of the docker sandbox", group="sandbox"),
    _t("docker_memory", "1g", "container memory limit (no swap beyond it)", check.docker_memory, group="sandbox"),
    Flag("docker_cpus", 1.0, "container CPU limit", check.number(0.01, 1024, "a number of CPUs"), group="sandbox"),
    Flag("docker_pids", 256, "container process limit", _int(1, MAX_PIDS), group="sandbox"),
    _t("host", "127.0.0.1", "`serve`: the address it listens on (each request needs the token)", group="serve"),
    Flag("port", 8470, "`serve`: the port it listens on (0: any free one)", _int(0, 65535), group="serve"),
    _t(
        "ray_address",
        None,
        "run on a Ray cluster: `local`, `auto` or `ray://host:port`",
        check.ray_address,
        group="scale",
    ),
    Flag(
        "request_timeout",
        600.0,
        "seconds a model call may take, connecting to its last byte, before it is retried",
        check.seconds,
        group="model",
    ),
    Flag(
        "max_retries",
        5,
        "retries of a model call (429 honouring Retry-After, 408, 409, 5xx, timeouts, dropped connections, "
        "malformed replies; other 4xx fail at once) before the sample's attempt fails",
        _int(0, 100),
        group="model",
    ),
    Flag("command_timeout", 60.0, "seconds a terminal command may run", check.seconds, group="tools"),
    Flag(
        "allow_private_urls",
        False,
        "let web and browser tools reach private and loopback addresses",
        check.boolean,
        group="tools",
    ),
    _t("vision_model", None, "model of vision_analyze and browser_vision", shown="--model", group="tools"),
    _t("image_model", None, "model of image_generate, which is offered only with one (or IMAGE_MODEL)", group="tools"),
    _t(
        "image_base_url",
        None,
        "endpoint of image_generate; the run's API key goes there only on --base_url's scheme, host and port, "
        "elsewhere IMAGE_API_KEY does (set it to the run's key to send that key)",
        check.optional_url,
        shown="--base_url",
        group="tools",
    ),
    Flag(
        "moa_models",
        None,
        "reference models of mixture_of_agents (comma-separated), which is offered only with some",
        check.name_list,
        kind=str,
        group="tools",
    ),
    _t("moa_aggregator", None, "aggregator model of mixture_of_agents", shown="--model", group="tools"),
    _t("local_model_path", None, "GGUF file for --model=local", shown="SmolLM2-135M", group="model"),
    _t("output_dir", "data", "parent of the run directory", group="run"),
    Flag(
        "export",
        None,
        "write the run in these formats to <output_dir>/<run_name>/export/<format>/: openai, llama_factory, hermes, "
        "atif, parquet, inspect, tokens (comma-separated); with --run_name alone it exports that run and exits, with "
        "--dataset_file at the end of every session",
        lambda n, v: check_formats(n, check.name_list(n, v)),
        kind=str,
        group="output",
    ),
    Flag(
        "export_completed_only",
        False,
        "export only trajectories the model ended by answering",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_no_partial",
        False,
        "leave partial trajectories (cut off, context full) out of the export",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_no_tool_errors",
        False,
        "leave trajectories with a failed tool call out of the export",
        check.boolean,
        group="output",
    ),
    Flag(
        "export_min_turns",
        0,
        "leave trajectories with fewer assistant turns out of the export",
        _int(0, 1_000_000),
        group="output",
    ),
    Flag(
        "export_toolsets",
        None,
        "export only trajectories that were offered all these toolsets (comma-separated)",
        check.name_list,
        kind=str,
        group="output",
    ),
    Flag(
        "export_passed_only",
        False,
        "export only trajectories whose check passed (`passed: true`)",
        check.boolean,
        group="output",
    ),
    Flag(
        "plugins",
        None,
        "Python modules or .py files (comma-separated) whose tools, sandbox backends, dataset formats or models "
        "the run uses, besides installed plug-ins (see docs/plugins.md)",
        check.name_list,
        kind=str,
        group="run",
    ),
    Flag(
        "report",
        False,
        "write the run's HTML report to <output_dir>/<run_name>/report.html (docs/report.md); with --run_name alone "
        "it writes it and exits, with --dataset_file at the end of every session",
        check.boolean,
        group="output",
    ),
    Flag(
        "compare",
        None,
        "runs to show beside --run_name's, side by side, in <output_dir>/<run_name>/compare.html: names under "
        "--output_dir or run directories (comma-separated); written when --report would be",
        check.name_list,
        text=True,
        group="output",
    ),
)
BY_NAME: dict[str, Flag] = {f.name: f for f in FLAGS}


def signature() -> inspect.Signature:
    """The CLI's signature for Fire: every flag with its default, then **unknown to name a mistyped flag."""
    params = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.annotation())
        for f in FLAGS
    ]
    params.append(inspect.Parameter("unknown", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def docstring(summary: str) -> str:
    """The CLI's docstring, whose Args section Fire shows in --help."""
    args = "\n".join(f"    {f.name}: {f.help}" for f in FLAGS)
    return f"{summary}\n\nArgs:\n{args}\n"


def parse(raw: Mapping[str, Any], implied: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every flag's checked value, in table order; the first bad one raises FatalError.

    `implied`: values another choice implies (a model's registration, model.registry.implied_flags), each in
    place of its flag's default: a flag given in `raw` keeps its value.
    """
    unknown = [name for name in raw if name not in BY_NAME]
    if unknown:
        raise FatalError(f"unknown flag --{unknown[0]}; see --help for the flags")
    wrong = [name for name in implied or () if name not in BY_NAME]
    if wrong:
        raise FatalError(f"--{wrong[0]} is implied (by the model's registration) but is no flag")
    defaults = {f.name: f.default for f in FLAGS} | (implied or {})
    return {f.name: f.check(f.name, raw.get(f.name, defaults[f.name])) for f in FLAGS}


def verbose(raw: Mapping[str, Any]) -> bool:
    """--verbose as given, for the log level and a fatal error's traceback before the flags are checked (a bad value
    counts as false here: the check names it)."""
    try:
        return check.boolean("verbose", raw.get("verbose", False))
    except FatalError:
        return False


def lists_distributions(raw: Mapping[str, Any]) -> bool:
    """Whether --list_distributions is asked for (checked: FatalError naming a bad value)."""
    return check.boolean("list_distributions", raw.get("list_distributions", False))


def names_own_toolsets(raw: Mapping[str, Any]) -> bool:
    """Whether the flags name toolsets of the run's own (files or modules), which --list_distributions checks."""
    return any(raw.get(name) is not None for name in ("distributions_file", "tools", "mcp_config", "plugins"))


def quote_text_flags(argv: list[str]) -> list[str]:
    """Make Fire keep the values of text flags exactly as typed (it parses values as Python literals)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        flag = BY_NAME.get(name[2:].replace("-", "_")) if name.startswith("--") else None
        if flag is not None and flag.text:
            if eq:
                out.append(f"{name}={value!r}")
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out.extend([name, repr(argv[i + 1])])
                i += 1
            else:
                out.append(arg)
        else:
            out.append(arg)
        i += 1
    return out


def reference_page() -> str:
    """docs/flags.md: every flag, one row each (`python -m agentbatch.flags > docs/flags.md` writes it)."""
    rows = ["| flag | default | notes |", "|---|---|---|"]
    rows += [f"| `--{f.name}` | {f.readme_default()} | {f.help} |" for f in FLAGS]
    return (
        "# Flags\n\n"
        "Every flag of `python batch_runner.py` and `batch-runner`, as `--help` prints them. This page is made from\n"
        "the one table that declares them (`agentbatch/flags.py`): `python -m agentbatch.flags > docs/flags.md`.\n\n"
        + "\n".join(rows)
        + "\n\nFire may hand comma lists over as tuples; both forms are accepted. Text flags keep their value exactly\n"
        'as typed (`--ephemeral_system_prompt="Be brief, please"`). A fatal problem (missing dataset, no valid\n'
        "entries, unknown distribution, bad flag value, unreadable prefill file, unknown flag) prints one line\n"
        "naming the problem and exits 2, with no traceback unless `--verbose`.\n\n"
        "Every value is checked before anything starts, by the flag's declaration: numbers are finite and within\n"
        "bounds (seconds at most a week, `--max_retries` at most 100, sizes at most 16384g and in ASCII digits,\n"
        "prices and budgets finite); URLs (`--base_url`, `--image_base_url`, `--ray_address`) parse, with a port\n"
        "from 1 to 65535, in printable ASCII and without credentials (the key goes in `--api_key`, which must be\n"
        "printable ASCII without spaces); files named by flags are regular files (the prefill file,\n"
        "`--mcp_config` and `--distributions_file` at most 16 MiB; a device or FIFO as the dataset or local model\n"
        "is refused). What is written after the run is checked before its first model call too: the runs\n"
        "`--compare` names exist, `--export_toolsets` names toolsets of the run. An error quotes a value in a\n"
        "short excerpt, however long it is.\n"
    )


if __name__ == "__main__":
    print(reference_page(), end="")
