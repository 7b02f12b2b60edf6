"""Every command-line flag, declared once: name, default, help and check.

The CLI's signature and `--help` (batch_runner.main), the checks run before anything starts, and the
reference page docs/flags.md all come from FLAGS; tests/test_flags.py holds the page to it. Each flag is
declared in the table of its group of the settings (agentbatch/flag_tables/<group>.py, a `Flag` of
flag_type.py); ORDER says where it stands among all of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import agentbatch.flag_checks as check
from agentbatch.errors import FatalError
from agentbatch.flag_tables import budget, limits, model, output, quality, run, sandbox, scale, serve, tools
from agentbatch.flag_type import Flag

# The order every list of the flags follows: the CLI's signature, --help, docs/flags.md, and the checks (the first
# bad value is the one named).
ORDER = tuple(
    """
    dataset_file batch_size run_name distribution tools mcp_config distributions_file model base_url api_key
    max_turns max_tokens max_tokens_per_prompt max_cost_per_prompt prompt_timeout price_input price_output
    budget_usd budget_tokens num_workers concurrency sandbox_starts resume verbose progress_seconds max_samples
    providers_allowed providers_ignored providers_order provider_sort reasoning_effort reasoning_disabled
    ephemeral_system_prompt log_prefix_chars prefill_messages_file list_distributions require_reasoning
    samples_per_prompt require_pass check_timeout keep_final_state rescore timeout_multiplier logprobs token_ids
    tokenizer policy_version seed cache cache_dir cache_expiry cache_size sandbox sandbox_network sandbox_memory
    sandbox_processes sandbox_file_size sandbox_cpu_seconds docker_image docker_memory docker_cpus docker_pids host
    port ray_address request_timeout max_retries command_timeout allow_private_urls vision_model image_model
    image_base_url moa_models moa_aggregator local_model_path output_dir export export_completed_only
    export_no_partial export_no_tool_errors export_min_turns export_toolsets export_passed_only plugins report
    compare
""".split()
)
TABLES = (run, tools, model, limits, budget, scale, quality, sandbox, serve, output)


def _in_order(tables: tuple[tuple[Flag, ...], ...], order: tuple[str, ...]) -> tuple[Flag, ...]:
    """The tables' flags in `order`; RuntimeError unless each is declared once and named once there."""
    declared = [f for table in tables for f in table]
    names = [f.name for f in declared]
    wrong = sorted(n for n in {*names, *order} if (names.count(n), order.count(n)) != (1, 1))
    if wrong:
        raise RuntimeError(f"a flag is declared once (agentbatch/flag_tables/) and named once in flags.ORDER: {wrong}")
    by_name = {f.name: f for f in declared}
    return tuple(by_name[name] for name in order)


FLAGS: tuple[Flag, ...] = _in_order(tuple(table.FLAGS for table in TABLES), ORDER)
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
