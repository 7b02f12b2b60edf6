"""A real run to export: the seeded scenarios run through the CLI, plus lines carrying the fields other issues add."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from cli_helpers import assert_clean_exit, read_jsonl, run_cli, write_dataset
from scripted_server import ScriptedServer
from test_seeded_run import PROMPTS, SCRIPT, _thinking

RUN = "exported"
NEW_BATCH = 90  # a batch file written "by a later version": reward, passed, verification, cost, logprobs


def make_run(base: Path) -> Path:
    """Run the seeded dataset (tool calls, parallel calls, bad JSON, errors, partial, max turns, discards,
    failures) through the real CLI, then add a batch of lines with the newer fields; returns the run dir."""
    with ScriptedServer(script=SCRIPT, default_script=[_thinking("default {prompt}")]) as srv:
        dataset = write_dataset(base / "ds.jsonl", PROMPTS)
        args = [f"--dataset_file={dataset}", "--batch_size=3", f"--run_name={RUN}", f"--output_dir={base}", "--seed=7"]
        args += ["--num_workers=2", "--concurrency=4", "--max_turns=4", "--max_retries=1"]
        assert_clean_exit(run_cli(args, base, srv), 3)  # p-fail fails: exit 3
    run_dir = base / RUN
    add_new_field_lines(run_dir)
    return run_dir


def new_field_line(record: dict, i: int) -> dict:
    """A copy of a real line as a version with verification, cost and logprobs would write it."""
    line = copy.deepcopy(record)
    line["sample_index"] = 1
    line["reward"] = 0.5 * (i % 3)
    line["passed"] = i % 3 == 2
    line["verification"] = {"command": "pytest -q", "exit_code": 0 if line["passed"] else 1, "output": f"check {i}"}
    line["usage"]["cost"] = 0.001 * (i + 1)
    for turn in line["conversations"]:
        if turn["from"] == "gpt":
            turn["logprobs"] = [{"token": "a", "logprob": -0.25}, {"token": "b", "logprob": -1.5}]
    return line


def add_new_field_lines(run_dir: Path) -> None:
    records = [r for r in read_jsonl(run_dir / "trajectories.jsonl")]
    with open(run_dir / f"batch_{NEW_BATCH}.jsonl", "w", encoding="utf-8") as f:
        for i, r in enumerate(records):
            f.write(json.dumps(new_field_line(r, i), ensure_ascii=False) + "\n")


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
