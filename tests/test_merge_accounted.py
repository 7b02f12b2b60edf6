"""The merge copies the lines a session counted as it wrote them: the same trajectories.jsonl and statistics as
reading every line back, whatever the lines hold (tool calls, redacted secrets, lone surrogates, unknown tools)."""

from __future__ import annotations

import json
from collections import Counter

from agentbatch.run_dir import lines as run_lines
from agentbatch.run_dir.answers import prompt_key
from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.merge import merge
from agentbatch.run_statistics import RunStats
from trajectory import first_human

SECRET = "sk-merge-secret-123456"


def record(i: int, text: str = "answer", tool: str | None = None) -> dict:
    turns = [{"from": "human", "value": f"prompt {i}"}, {"from": "gpt", "value": f"<think>\nr\n</think>\n{text}"}]
    if tool:
        turns[1]["tool_calls"] = [{"id": "c1", "name": tool, "arguments": "{}"}]
        turns.append({"from": "tool", "value": "{}", "tool_call_id": "c1", "name": tool})
    return {
        "prompt_index": i,
        "conversations": turns,
        "completed": True,
        "partial": False,
        "stop_reason": "answered",
        "api_calls": 1 + bool(tool),
        "tool_stats": {tool: {"count": 1, "success": 1, "failure": 0}} if tool else {},
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "tools": json.dumps([{"type": "function", "function": {"name": "terminal"}}]),
    }


def count(stats: RunStats, kept: Counter, r: dict) -> None:
    stats.add_trajectory(r)
    kept[prompt_key(first_human(r))] += 1


def test_merging_counted_lines_equals_reading_every_line_back(tmp_path):
    earlier = RunFiles(str(tmp_path), secrets=(SECRET,))
    earlier.prepare()
    for i in range(3):  # a previous session's batch: no tool call in it
        earlier.append(earlier.paths.batch(0), record(i), kept=True)
    earlier.close()

    session = RunFiles(str(tmp_path), secrets=(SECRET,))
    stats, kept = RunStats(), Counter()
    lines = [
        record(10),
        record(11, tool="terminal"),
        record(12, text=f"it echoed {SECRET}"),  # written redacted: not the record in memory
        record(13, text="lone \ud800 surrogate"),  # written as its escape
        record(14, tool="not_a_tool"),  # the merge filters it
        record(15, tool="terminal"),  # the newest batch's kept line with a tool call: it leads trajectories.jsonl
    ]
    counted = []
    for n, r in ((1, lines[0]), (1, lines[1]), (1, lines[2]), (2, lines[3]), (2, lines[4]), (2, lines[5])):
        if session.append(session.paths.batch(n), r, kept=True):
            count(stats, kept, r)
            counted.append(r["prompt_index"])
    assert counted == [10, 11, 15]
    session.close()

    def absorb(r: dict) -> None:
        count(stats, kept, r)

    report = merge(session, absorb)
    merged = (tmp_path / "trajectories.jsonl").read_bytes()

    (tmp_path / "trajectories.jsonl").unlink()
    reread_stats, reread_kept = RunStats(), Counter()
    reread = merge(RunFiles(str(tmp_path), secrets=(SECRET,)), lambda r: count(reread_stats, reread_kept, r))

    assert merged == (tmp_path / "trajectories.jsonl").read_bytes()
    assert (
        (report.trajectories, report.unknown_tool, report.not_json)
        == (reread.trajectories, reread.unknown_tool, 0)
        == (8, 1, 0)
    )
    assert stats.to_dict() == reread_stats.to_dict() and kept == reread_kept
    first = json.loads(merged.splitlines()[0])
    assert first["prompt_index"] == 15 and SECRET.encode() not in merged


def test_a_counted_line_changed_on_disk_is_read_back(tmp_path):
    files = RunFiles(str(tmp_path))
    files.prepare()
    assert files.append(files.paths.batch(0), record(1), kept=True)
    files.close()
    path = tmp_path / "batch_0.jsonl"
    path.write_bytes(path.read_bytes() + json.dumps(record(2)).encode() + b"\n")  # not written by the session
    seen = []
    report = merge(files, lambda r: seen.append(r["prompt_index"]))
    assert report.trajectories == 2 and seen == [2]


def test_batches_a_session_wrote_alone_are_not_searched_for_leads(tmp_path, monkeypatch):
    """The lead entries come from append's notes for files this session wrote alone (a kind none of its lines
    shows, here logprobs, is looked for only in the earlier session's file); the output is byte for byte what
    reading every line back gives."""
    earlier = RunFiles(str(tmp_path))
    earlier.prepare()
    old = record(0)
    old["conversations"][1]["logprobs"] = {"content": [{"token": "a", "logprob": -0.5}]}
    earlier.append(earlier.paths.batch(0), old, kept=True)
    earlier.append(earlier.paths.batch(0), record(1), kept=True)
    earlier.close()

    session = RunFiles(str(tmp_path))
    for n, i, tool in ((1, 10, None), (1, 11, "terminal"), (2, 12, None), (2, 13, None), (2, 14, "terminal")):
        assert session.append(session.paths.batch(n), record(i, tool=tool), kept=True)
    session.close()

    searched, read = [], run_lines.read

    def spy(path, counts=None, **how):
        if how.get("parse", True) is None:
            searched.append(path.rsplit("/", 1)[-1])
        return read(path, counts, **how)

    monkeypatch.setattr(run_lines, "read", spy)
    merge(session)
    merged = (tmp_path / "trajectories.jsonl").read_bytes()
    assert searched == ["batch_0.jsonl"]

    (tmp_path / "trajectories.jsonl").unlink()
    merge(RunFiles(str(tmp_path)))
    assert merged == (tmp_path / "trajectories.jsonl").read_bytes()
    leads = [json.loads(line)["prompt_index"] for line in merged.splitlines()[:2]]
    assert leads == [14, 0]  # the newest batch's tool call, then the only logprobs
    assert searched == ["batch_0.jsonl", "batch_2.jsonl", "batch_1.jsonl", "batch_0.jsonl"]
