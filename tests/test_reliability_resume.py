"""Reliability: --resume survives lines that are valid JSON of the wrong shape (issue 18, items 9 and 10).

The resume scan, the merge and the statistics each read every line; a hand-edited, foreign or older line
of another shape is dropped and counted, never trusted and never a traceback.
"""

from __future__ import annotations

import json
from collections import Counter

import datasets
from cli_helpers import RunDir, assert_clean_exit, first_turn_prompts, prompt_of_record, run_cli, write_dataset
from scripted_server import ScriptedServer

PROMPTS = [f"shape prompt {i}" for i in range(5)]
DEEP = "[" * 100_000 + "]" * 100_000


def args_for(data, out, srv, *extra) -> list[str]:
    return [
        f"--dataset_file={data}",
        "--batch_size=2",
        "--run_name=shapes",
        "--model=m",
        f"--output_dir={out}",
        f"--base_url={srv.base_url}",
        "--api_key=shapes-test-key",
        "--distribution=terminal_only",
        "--num_workers=1",
        *extra,
    ]


def append_lines(path, lines: list[str]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def test_resume_drops_and_counts_lines_of_the_wrong_shape(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS)
    run = RunDir(tmp_path / "out" / "shapes")
    # The last prompt never reasons, so discarded.jsonl exists to be spoiled too.
    script = {PROMPTS[-1]: [{"content": "no reasoning"}]}
    with ScriptedServer(script=script, default_script=[{"content": "fine", "reasoning": "hm"}]) as srv:
        first = run_cli(args_for(data, tmp_path / "out", srv, "--max_samples=2"), tmp_path)
        assert_clean_exit(first)
        good = run.batch_records()[0]
        # A trajectory-like line for prompt 2, which has not run: it must not count as its answer.
        bad_stats = dict(good, conversations=[{"from": "human", "value": PROMPTS[2]}], tool_stats="bad")
        append_lines(
            run.path / "batch_0.jsonl",
            [
                json.dumps({"conversations": "x"}),
                "[1]",
                json.dumps({"a": 1}),
                json.dumps(bad_stats),
                json.dumps(dict(good, usage={"prompt_tokens": "lots"})),
                DEEP,
            ],
        )
        append_lines(
            run.path / "discarded.jsonl",
            ["[1]", json.dumps({"conversations": [{"from": "human", "value": PROMPTS[3]}], "usage": "x"}), DEEP],
        )
        append_lines(
            run.path / "failed.jsonl",
            ["[1]", json.dumps({"prompt": ["x"], "usage": "lots"}), json.dumps({"prompt": PROMPTS[4], "usage": [1]})],
        )
        (run.path / "checkpoint.json").write_text('{"duration_seconds": "long", "sessions": [1]}')
        asked = len(srv.requests())

        second = run_cli(args_for(data, tmp_path / "out", srv, "--resume"), tmp_path)
        started = first_turn_prompts(srv, since=asked)
    assert_clean_exit(second)
    # Exactly the prompts not yet answered ran: the shaped-like lines answered nothing.
    assert started == Counter(PROMPTS[2:])
    discarded = [d for d in run.discarded() if "discard_reason" in d]  # not the spoiled lines appended above
    assert Counter(prompt_of_record(r) for r in run.trajectories() + discarded) == Counter(PROMPTS)
    stats = run.stats()
    assert stats["merge"]["filtered_malformed"] == 5, stats["merge"]
    assert stats["merge"]["filtered_not_json"] == 1, stats["merge"]
    assert stats["merge"]["kept"] == 4
    assert stats["prompts"] == {"total": 5, "done": 4, "discarded": 1, "failed": 0, "not_run": 0}
    assert stats["discarded"] == 1
    assert "5 not trajectories" in second.stdout
    # What remains is one schema: the merged file loads whole.
    loaded = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert len(loaded) == 4


def test_a_lone_surrogate_escape_written_by_an_older_version_is_repaired_by_the_merge(tmp_path):
    """Older versions wrote a lone surrogate as the JSON escape "\\ud800", which made the merged file unloadable."""
    data = write_dataset(tmp_path / "ds.jsonl", PROMPTS[:2])
    run = RunDir(tmp_path / "out" / "shapes")
    with ScriptedServer(default_script=[{"content": "fine", "reasoning": "hm"}]) as srv:
        first = run_cli(args_for(data, tmp_path / "out", srv, "--max_samples=1"), tmp_path)
        assert_clean_exit(first)
        batch = run.path / "batch_0.jsonl"
        batch.write_text(batch.read_text(encoding="utf-8").replace("fine", "fi\\ud800ne"), encoding="utf-8")
        second = run_cli(args_for(data, tmp_path / "out", srv, "--resume"), tmp_path)
    assert_clean_exit(second)
    assert "\\ud800" in (run.path / "batch_0.jsonl").read_text(), "the merge never changes a batch file"
    loaded = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert len(loaded) == 2
    repaired = next(r for r in run.trajectories() if prompt_of_record(r) == PROMPTS[0])
    assert repaired["conversations"][1]["value"].endswith("fi\ufffdne")
