"""A real run to export: the seeded scenarios and a run of checked rows with logprobs, both through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cli_helpers import assert_clean_exit, read_jsonl, run_cli, write_dataset
from scripted_server import ScriptedServer
from test_seeded_run import PROMPTS, SCRIPT, _thinking
from verify_helpers import answer, args_for, sh

from trajectory import to_conversations

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


def from_openai_messages(messages: list[dict]) -> list[dict]:
    """OpenAI chat messages → ShareGPT turns (the inverse of trajectory.to_openai_messages); a tool turn's name is
    its call's."""
    names: dict = {}
    turns: list[dict] = []
    for m in messages:
        if m.get("role") == "system":
            turns.append({"from": "system", "value": m.get("content") or ""})
            continue
        if m.get("role") == "assistant":
            names = {c.get("id"): c["function"]["name"] for c in m.get("tool_calls") or []}
            m = dict(m, reasoning=m.get("reasoning_content") or "")
        elif m.get("role") == "tool":
            m = dict(m, name=m.get("name") or names.get(m.get("tool_call_id")))
        turns.extend(to_conversations([m]))
    return turns


def openai_line_to_trajectory(line: dict) -> dict:
    """An openai export line → the trajectory fields it holds (`conversations` with their logprobs, `tools` as
    our JSON string, the outcome): what shows the export loses nothing."""
    messages = line.get("messages") or []
    conversations = from_openai_messages([{k: v for k, v in m.items() if k != "logprobs"} for m in messages])
    gpt = [t for t in conversations if t.get("from") == "gpt"]
    for turn, message in zip(gpt, (m for m in messages if m.get("role") == "assistant"), strict=True):
        if message.get("logprobs") is not None:
            turn["logprobs"] = message["logprobs"]
    fields = {k: line[k] for k in ("sample_index", "reward", "passed", "check", "task") if k in line}
    return {"conversations": conversations, "tools": json.dumps(line.get("tools") or [], ensure_ascii=False), **fields}
