"""statistics.json and the printed summary agree with what the output files hold, recounted here."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, write_dataset
from scripted_server import ScriptedServer

from agentbatch.tools.registry import ALL_TOOL_NAMES


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def call(name: str, arguments) -> dict:
    return {"name": name, "arguments": arguments}


SCRIPT = {
    "tool success": [
        {"tool_calls": [call("terminal", {"command": "echo hello"})], "reasoning": "run it", "usage": usage(100, 7)},
        {"content": "it printed hello", "reasoning": "done", "usage": usage(130, 9)},
    ],
    "tool failure": [
        {
            "tool_calls": [call("read_file", {"path": "no/such/file.txt"}), call("terminal", {"command": "echo a"})],
            "reasoning": "look",
        },
        {"content": "the file is missing"},  # a turn without reasoning: coverage below 100%
    ],
    "bad arguments": [
        {"tool_calls": [call("write_file", "{not json")], "reasoning": "write"},
        {"content": "gave up", "reasoning": "oh well"},
    ],
    "cut short": [{"content": "and then", "reasoning": "long", "finish_reason": "length", "usage": usage(50, 4096)}],
    "loops forever": [{"tool_calls": [call("terminal", {"command": "true"})], "reasoning": "again"}],
    "never reasons": [{"content": "plain answer", "usage": usage(11, 3)}],
    "always fails": [{"fault": "500", "fault_times": -1}],
    "simple": [{"content": "fine", "reasoning": "easy"}],
}
DATASET = [*SCRIPT, "simple"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("stats")
    write_dataset(cwd / "ds.jsonl", DATASET)
    args = [
        "--dataset_file=ds.jsonl",
        "--batch_size=3",
        "--run_name=stats",
        "--num_workers=2",
        "--distribution=terminal_only",
        "--max_turns=3",
        "--max_retries=0",
    ]
    with ScriptedServer(script=SCRIPT) as srv:
        proc = run_cli(args, cwd, srv)
    assert_clean_exit(proc, code=3)
    return proc, RunDir(cwd / "data" / "stats")


def recount_tools(records: list[dict]) -> dict[str, dict[str, int]]:
    """Per tool calls/successes/failures straight from the conversations, results matched by tool_call_id."""
    tools = {name: {"count": 0, "success": 0, "failure": 0} for name in ALL_TOOL_NAMES}
    for r in records:
        results = {t["tool_call_id"]: t["value"] for t in r["conversations"] if t["from"] == "tool"}
        for turn in r["conversations"]:
            for c in turn.get("tool_calls", []):
                value = results.get(c["id"])
                try:
                    parsed = json.loads(value) if value is not None else {"error": "no result"}
                except ValueError:
                    parsed = {}
                ok = not (isinstance(parsed, dict) and parsed.get("error"))
                tools[c["name"]]["count"] += 1
                tools[c["name"]]["success" if ok else "failure"] += 1
    return tools


def token_sum(lines: list[dict]) -> dict[str, int]:
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    return {k: sum(int((line.get("usage") or {}).get(k, 0)) for line in lines) for k in keys}


def test_statistics_equal_a_recount_of_the_files(finished_run):
    _, run = finished_run
    stats = run.stats()
    records, discarded, failed = run.trajectories(), run.discarded(), run.failed()

    assert stats["trajectories"] == len(records) == stats["merge"]["kept"]
    assert stats["completed"] == sum(1 for r in records if r["completed"])
    assert stats["partial"] == sum(1 for r in records if r["partial"] and not r["completed"])
    assert stats["max_turns_reached"] == sum(1 for r in records if not r["completed"] and not r["partial"])
    assert stats["api_calls"] == sum(r["api_calls"] for r in records)
    assert stats["discarded"] == len(discarded)
    assert stats["discard_reasons"] == dict(Counter(d["discard_reason"] for d in discarded))

    gpt_turns = [t["value"] for r in records for t in r["conversations"] if t["from"] == "gpt"]
    with_reasoning = sum(1 for v in gpt_turns if v.startswith("<think>"))
    assert stats["reasoning"]["assistant_turns"] == len(gpt_turns)
    assert stats["reasoning"]["with_reasoning"] == with_reasoning
    assert stats["reasoning"]["without_reasoning"] == len(gpt_turns) - with_reasoning
    assert stats["reasoning"]["coverage"] == pytest.approx(with_reasoning / len(gpt_turns), abs=1e-4)

    recount = recount_tools(records)
    for name in ALL_TOOL_NAMES:
        s = stats["tools"][name]
        assert {k: s[k] for k in ("count", "success", "failure")} == recount[name], name
        expected_rate = recount[name]["success"] / recount[name]["count"] if recount[name]["count"] else None
        assert s["success_rate"] == (pytest.approx(expected_rate, abs=1e-4) if expected_rate is not None else None)
        # Each record's own tool_stats agree with its conversation too.
        assert sum(r["tool_stats"][name]["count"] for r in records) == recount[name]["count"]

    assert stats["tokens"]["trajectories"] == token_sum(records)
    assert stats["tokens"]["discarded"] == token_sum(discarded)
    assert stats["tokens"]["failed_attempts"] == token_sum(failed)
    assert stats["tokens"]["total"] == token_sum(records + discarded + failed)

    answered = Counter(prompt_of_record(r) for r in records)
    thrown = Counter(prompt_of_record(d) for d in discarded)
    failed_prompts = {f["prompt"] for f in failed}
    assert stats["samples"] == {
        "total": len(DATASET),
        "done": sum(answered.values()),
        "discarded": sum(thrown.values()),
        "failed": sum(1 for p in DATASET if p in failed_prompts and p not in answered and p not in thrown),
        "not_run": 0,
    }


def test_the_recount_matches_what_the_script_makes_happen(finished_run):
    """Guards the recount itself: the scripted run has known figures."""
    _, run = finished_run
    stats = run.stats()
    assert stats["samples"] == {"total": 9, "done": 7, "discarded": 1, "failed": 1, "not_run": 0}
    assert (stats["completed"], stats["partial"], stats["max_turns_reached"]) == (5, 1, 1)
    assert stats["discard_reasons"] == {"no_reasoning": 1}
    tools = stats["tools"]
    assert (tools["terminal"]["count"], tools["terminal"]["success"]) == (5, 5)  # 1 + 1 + 3 loop turns
    assert (tools["read_file"]["count"], tools["read_file"]["failure"]) == (1, 1)
    assert (tools["write_file"]["count"], tools["write_file"]["failure"]) == (1, 1)  # arguments not JSON
    assert tools["terminal"]["success_rate"] == 1.0 and tools["patch"]["success_rate"] is None
    # 2 + 2 + 2 + 1 + 3 + 1 + 1 gpt turns; only "the file is missing" lacks reasoning.
    assert stats["reasoning"]["assistant_turns"] == 12 and stats["reasoning"]["without_reasoning"] == 1
    assert stats["tokens"]["discarded"] == usage(11, 3)
    assert stats["tokens"]["failed_attempts"] == usage(0, 0)
    looped = next(r for r in run.trajectories() if prompt_of_record(r) == "loops forever")
    assert looped["api_calls"] == 3 and not looped["completed"]


def test_the_printed_summary_shows_the_same_figures(finished_run):
    proc, run = finished_run
    stats = run.stats()
    out = proc.stdout
    assert f"done {stats['samples']['done']}" in out
    assert f"discarded {stats['discarded']}" in out
    assert f"failed {stats['samples']['failed']}" in out
    assert f"{stats['merge']['kept']} lines kept, 0 filtered for unknown tools" in out
    r = stats["reasoning"]
    assert f"reasoning: {r['with_reasoning']} of {r['assistant_turns']} assistant turns" in out
    assert f"tokens: {stats['tokens']['total']['total_tokens']} " in out
    terminal_row = next(line.split() for line in out.splitlines() if line.strip().startswith("terminal "))
    assert terminal_row[1:4] == ["5", "5", "0"]
    read_row = next(line.split() for line in out.splitlines() if line.strip().startswith("read_file "))
    assert read_row[1:4] == ["1", "0", "1"]


def test_checkpoint_is_valid_json_naming_the_finished_run(finished_run):
    _, run = finished_run
    checkpoint = run.json("checkpoint.json")
    assert checkpoint["state"] == "finished" and checkpoint["total_prompts"] == len(DATASET)
    assert checkpoint["batches"] == run.batch_numbers()
    assert not list(run.path.glob("*.tmp")), "an atomic replace left its temporary file behind"


def test_samples_count_every_sample_and_prompts_keeps_their_old_name(tmp_path):
    """statistics.json's `samples` counts samples (2 per prompt here), not prompts; `prompts`, its name before,
    stays beside it for one release (docs/output.md); the summary and the exit line say samples."""
    dataset = ["simple", "tool success", "always fails"]
    write_dataset(tmp_path / "ds.jsonl", dataset)
    args = ["--dataset_file=ds.jsonl", "--batch_size=4", "--run_name=twice", "--num_workers=2"]
    args += ["--distribution=terminal_only", "--max_retries=0", "--samples_per_prompt=2"]
    with ScriptedServer(script=SCRIPT) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, code=3)
    run = RunDir(tmp_path / "data" / "twice")
    stats, records, failed = run.stats(), run.trajectories(), run.failed()
    assert len(records) == 4 and {(f["prompt"], f["sample_index"]) for f in failed} == {
        ("always fails", 0),
        ("always fails", 1),
    }
    assert stats["samples"] == {"total": 6, "done": 4, "discarded": 0, "failed": 2, "not_run": 0}
    assert stats["samples"]["total"] == len(dataset) * 2 == len(records) + len(failed)
    assert stats["prompts"] == stats["samples"]
    assert "3 prompts × 2 samples in the dataset" in proc.stdout and "failed 2  not run 0" in proc.stdout
    assert "2 samples failed (see failed.jsonl)" in proc.stderr
