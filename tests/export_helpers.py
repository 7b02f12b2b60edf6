"""A real run to export: the seeded scenarios and a run of checked rows with logprobs, both through the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

from cli_helpers import assert_clean_exit, read_jsonl, run_cli, write_dataset
from scripted_server import ScriptedServer
from test_seeded_run import PROMPTS, SCRIPT, _thinking
from verify_helpers import answer, args_for, sh

LOGPROBS_IDS = {"logprobs": True, "token_ids": True}

RUN = "exported"
NEW_BATCH = 90  # the outcome run's batch files are renumbered from here: lines with checks, samples and logprobs
# Rows whose checks pass, fail, give partial credit, time out, or are absent; run twice each with --logprobs.
OUTCOME_ROWS = [
    {"prompt": "o-verify", "verify": "test -f out.txt"},
    {"prompt": "o-answer", "answer": "42"},
    {"prompt": "o-wrong", "answer": "42"},
    {"prompt": "o-partial", "verify": """echo '{"reward": 0.5, "passed": 1, "total": 2}'"""},
    {"prompt": "o-timeout", "verify": "sleep 30"},
    {"prompt": "o-plain"},
]
OUTCOME_SCRIPT = {
    # A tool call whose logprobs hold a null (a server's -inf), then an answer with token ids.
    "o-verify": [sh("echo > out.txt") | {"logprobs": [["<call>", -1.25], ["!", None]]}, answer("made") | LOGPROBS_IDS],
    "o-answer": [answer("It is 42.") | {"logprobs": True}],  # logprobs without token ids
    "o-wrong": [answer("It is 41.") | LOGPROBS_IDS],
    "o-partial": [answer("half")],
    "o-timeout": [answer("waiting")],
}


def make_run(base: Path) -> Path:
    """Run the seeded dataset (tool calls, parallel calls, bad JSON, errors, partial, max turns, discards,
    failures) through the real CLI, then a run of checked rows with --logprobs and two samples a prompt, whose
    batch files join the first run's as batches NEW_BATCH...; returns the run dir."""
    with ScriptedServer(script=SCRIPT, default_script=[_thinking("default {prompt}")]) as srv:
        dataset = write_dataset(base / "ds.jsonl", PROMPTS)
        args = [f"--dataset_file={dataset}", "--batch_size=3", f"--run_name={RUN}", f"--output_dir={base}", "--seed=7"]
        args += ["--num_workers=2", "--concurrency=4", "--max_turns=4", "--max_retries=1"]
        assert_clean_exit(run_cli(args, base, srv), 3)  # p-fail fails: exit 3
    run_dir = base / RUN
    outcome_dir = make_outcome_run(base / "outcomes")
    for i, path in enumerate(sorted(outcome_dir.glob("batch_*.jsonl"), key=lambda p: int(p.stem.split("_")[1]))):
        shutil.copyfile(path, run_dir / f"batch_{NEW_BATCH + i}.jsonl")
    return run_dir


def make_outcome_run(base: Path) -> Path:
    """OUTCOME_ROWS through the real CLI: `--logprobs --samples_per_prompt=2`, checks in local sandboxes."""
    base.mkdir()
    data = write_dataset(base / "ds.jsonl", OUTCOME_ROWS)
    with ScriptedServer(script=OUTCOME_SCRIPT, default_script=[answer("ok")]) as srv:
        flags = ["--logprobs", "--samples_per_prompt=2", "--check_timeout=2"]
        assert_clean_exit(run_cli(args_for(data, base, "outcomes", *flags), base, srv))
    return base / "outcomes"


def copy_run(src: Path, dest_parent: Path) -> Path:
    """A private copy of the run, for tests that export or change it."""
    dest = dest_parent / RUN
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("export"))
    return dest


def export_cli(run_dir: Path, *flags: str, env: dict | None = None):
    """`python batch_runner.py --run_name=NAME --output_dir=DIR --export=...` (no dataset: export only)."""
    return run_cli([f"--run_name={run_dir.name}", f"--output_dir={run_dir.parent}", *flags], run_dir.parent, env=env)


def batch_records(run_dir: Path) -> list[dict]:
    """The lines an export reads, in its order (batch files in numeric order)."""
    numbers = sorted(int(p.stem.split("_")[1]) for p in run_dir.glob("batch_*.jsonl"))
    return [r for n in numbers for r in read_jsonl(run_dir / f"batch_{n}.jsonl")]
