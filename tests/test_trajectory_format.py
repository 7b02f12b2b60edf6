"""The trajectory line: tool statistics by call id, and 200 real, mixed lines that `datasets` loads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from helpers import gpt_turns, model_settings, run_agent_once, tool_turns
from scripted_server import ScriptedServer

from agentbatch.sample_runner import Clients
from agentbatch.tools.registry import offered_tools
from agentbatch.tools.settings import ToolSettings
from agentbatch.work import RunConfig
from toolset_distributions import ALL_TOOL_NAMES, DISTRIBUTIONS, prompt_rng, sample_toolsets
from trajectory import STOP_REASONS, reasoning_counts, unknown_tools

N_LINES = 200
SCENARIOS = 8


def gpt(value: str, *calls: tuple[str, str]) -> dict:
    turn = {"from": "gpt", "value": value}
    if calls:
        turn["tool_calls"] = [{"id": i, "name": n, "arguments": "{}"} for i, n in calls]
    return turn


def tool(call_id: str, name: str, error: str | None) -> dict:
    return {"from": "tool", "value": json.dumps({"output": "", "error": error}), "tool_call_id": call_id, "name": name}


def test_unknown_tools_and_reasoning_counts():
    conv = [{"from": "human", "value": "q"}, gpt("<think>\nr\n</think>\nx", ("a", "made_up")), gpt("plain")]
    assert unknown_tools(conv) == {"made_up"}
    assert reasoning_counts(conv) == (1, 1)


def _calls(offered: set[str], i: int) -> tuple[dict | None, dict | None]:
    """A call that succeeds and one that fails, among the tools offered (None when none fits)."""
    ok = fail = None
    if "terminal" in offered:
        ok = {"name": "terminal", "arguments": {"command": f"echo line {i}"}}
        fail = {"name": "terminal", "arguments": '{"command": '}
    if "read_file" in offered:
        fail = {"name": "read_file", "arguments": {"path": f"missing-{i}.txt"}}
        ok = ok or {"name": "write_file", "arguments": {"path": f"f{i}.txt", "content": "x"}}
    return ok, fail


def _script(scenario: int, i: int, offered: set[str]) -> tuple[list[dict], int]:
    """Reply specs for one prompt and its max_turns; a call the prompt was not offered becomes an unknown tool."""
    ok, fail = _calls(offered, i)
    ok = ok or {"name": "terminal", "arguments": {"command": "true"}}
    fail = fail or {"name": "read_file", "arguments": {"path": "x"}}
    why = f"reasoning {i}"
    answer = {"content": f"answer {i}"}
    if scenario == 0:
        return [{**answer, "reasoning": why}], 10
    if scenario == 1:
        return [{"reasoning_content": why, "tool_calls": [ok]}, answer], 10
    if scenario == 2:
        details = [{"type": "reasoning.text", "text": why, "signature": "s"}]
        return [{"reasoning_details": details, "tool_calls": [fail]}, answer], 10
    if scenario == 3:
        return [{"content": "try", "tool_calls": [{"name": "no_such_tool", "arguments": {}}]}], 10
    if scenario == 4:
        return [{"content": f"<think>{why}</think>cut off mid", "finish_reason": "length"}], 10
    if scenario == 5:
        pad = f"<REASONING_SCRATCHPAD>{why}</REASONING_SCRATCHPAD>Two at once."
        return [{"content": pad, "tool_calls": [ok, fail]}, answer], 10
    if scenario == 6:
        details = [{"type": "reasoning.summary", "summary": why}]
        return [{"reasoning_details": details, "tool_calls": [ok]}, {"fault": "context_length", "fault_times": -1}], 10
    return [{"content": "again", "tool_calls": [ok]}], 2


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> tuple[str, list[dict]]:
    """200 trajectory lines from the real loop, every distribution's toolset mixes crossed with 8 scenarios."""
    settings = ToolSettings(command_timeout=10.0)
    dists = list(DISTRIBUTIONS.values())
    plan = []
    for i in range(N_LINES):
        toolsets = sample_toolsets(dists[i % len(dists)], prompt_rng(1234, i))
        offered = {t.name for t in offered_tools(toolsets, settings)}
        replies, max_turns = _script(i % SCENARIOS, i, offered)
        plan.append((f"prompt {i}: do the thing", toolsets, max_turns, replies))
    records = []
    with ScriptedServer(script={p: replies for p, _, _, replies in plan}) as srv:
        cfg = RunConfig(run_name="t", model=model_settings(srv), tools=settings)
        clients = Clients.for_config(cfg)  # one set for all 200 prompts, as a worker has
        for i, (prompt, toolsets, max_turns, _) in enumerate(plan):
            records.append(
                run_agent_once(
                    srv, prompt, toolsets, max_turns=max_turns, tool_settings=settings, prompt_index=i, clients=clients
                )
            )
    path = tmp_path_factory.mktemp("traj") / "trajectories.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path), records


def test_lines_are_heterogeneous(lines):
    _, records = lines
    kinds = Counter()
    for r in records:
        tools = tool_turns(r)
        kinds["tools"] += bool(tools)
        kinds["no_tools"] += not tools
        kinds["tool_failure"] += any(json.loads(t["value"]).get("error") for t in tools)
        kinds["completed"] += r["completed"]
        kinds["partial"] += r["partial"]
        kinds["max_turns"] += not r["completed"] and not r["partial"]
        kinds["reasoning"] += any(t["value"].startswith("<think>\n") for t in gpt_turns(r))
    assert all(kinds[k] >= 10 for k in ("tools", "no_tools", "tool_failure", "completed", "partial", "max_turns"))
    assert kinds["reasoning"] >= N_LINES // 3
    assert len({tuple(r["toolsets_used"]) for r in records}) >= 20
    assert len({r["tools"] for r in records}) >= 5


def test_every_line_has_the_same_shape_and_names_every_tool(lines):
    _, records = lines
    keys = set(records[0])
    for r in records:
        assert set(r) == keys
        assert list(r["tool_stats"]) == list(ALL_TOOL_NAMES)
        assert list(r["tool_error_counts"]) == list(ALL_TOOL_NAMES)
        assert all(r["tool_error_counts"][n] == s["failure"] for n, s in r["tool_stats"].items())
        assert set(r["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "cost", "cached_calls"}
        assert isinstance(r["usage"]["cost"], float)
        assert isinstance(r["tools"], str) and isinstance(json.loads(r["tools"]), list)
        for turn in r["conversations"]:
            assert isinstance(turn["value"], str)
            assert all(isinstance(c["arguments"], str) for c in turn.get("tool_calls") or [])
        assert not unknown_tools(r["conversations"])  # unknown-tool replies are never saved


def _load(path: str, tmp_path, monkeypatch, **kwargs):
    """datasets.load_dataset("json") with the network off and every cache under tmp_path."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    return datasets.load_dataset("json", data_files=path, split="train", cache_dir=str(tmp_path / "cache"), **kwargs)


def test_datasets_loads_every_line(lines, tmp_path, monkeypatch):
    path, records = lines
    ds = _load(path, tmp_path, monkeypatch)
    assert ds.num_rows == N_LINES
    assert ds[5]["prompt_index"] == 5 and ds[5]["conversations"][0]["value"] == records[5]["conversations"][0]["value"]
    assert ds[N_LINES - 1]["tool_stats"]["terminal"] == records[-1]["tool_stats"]["terminal"]


def _rewrite(records: list[dict], path) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return str(path)


CHUNK = 16 << 10


def test_datasets_loads_lines_spread_over_many_chunks(lines, tmp_path, monkeypatch):
    # Small chunks make the loader infer a schema per chunk and cast later chunks to the first one, as it
    # does on files over 10 MB. The first chunk holds a tool-using line, as any real run's first 10 MB does.
    _, records = lines
    first = next(i for i, r in enumerate(records) if tool_turns(r) and r["partial"])
    path = _rewrite([records[first], *records[:first], *records[first + 1 :]], tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").stat().st_size > 8 * CHUNK
    ds = _load(path, tmp_path, monkeypatch, chunksize=CHUNK)
    assert ds.num_rows == N_LINES
    assert sorted(ds["prompt_index"]) == list(range(N_LINES))


def test_merge_puts_a_tool_using_entry_first_so_any_order_of_batches_loads(lines, tmp_path, monkeypatch):
    # Batch files whose first 16 KiB hold no tool turn at all: loaded as they are, datasets would fix a
    # schema without tool fields from that first chunk and fail on later chunks. The merge prevents it.
    from agentbatch.run_dir.files import RunFiles
    from agentbatch.run_dir.merge import merge

    _, records = lines
    ordered = sorted(records, key=lambda r: bool(tool_turns(r)))
    files = RunFiles(str(tmp_path / "run"))
    files.prepare()
    half = len(ordered) // 2
    _rewrite(ordered[:half], files.paths.batch(0))
    _rewrite(ordered[half:], files.paths.batch(1))
    report = merge(files)
    assert report.trajectories == N_LINES
    merged = [json.loads(line) for line in open(files.paths.path("trajectories.jsonl"), encoding="utf-8")]
    # The leads come from the newest batch first: its first line (showing the outcome fields, as every line
    # does), then its first tool-using line if that first line has no tool call.
    newest = ordered[half:]
    leads = [newest[0]] if tool_turns(newest[0]) else [newest[0], next(x for x in newest if tool_turns(x))]
    assert merged[: len(leads)] == leads
    assert merged[len(leads) :] == [r for r in ordered if all(r is not x for x in leads)]
    ds = _load(files.paths.path("trajectories.jsonl"), tmp_path, monkeypatch, chunksize=CHUNK)
    assert ds.num_rows == N_LINES


def _old_shape(record: dict) -> dict:
    """A line as runs wrote it before stop_reason, sample_index, identity and the cost in usage existed."""
    old = {k: v for k, v in record.items() if k not in ("stop_reason", "sample_index", "identity")}
    old["usage"] = {k: v for k, v in record["usage"].items() if k != "cost"}
    return old


def test_a_resumed_run_mixing_old_and_new_lines_merges_into_one_loadable_file(lines, tmp_path, monkeypatch):
    # The first session wrote old-shaped lines, tool-using ones among them; the resumed one writes every field.
    # Whatever the first block holds, the merge's lead entry must show every field, or chunked loading fails.
    from agentbatch.run_dir.files import RunFiles
    from agentbatch.run_dir.merge import merge

    _, records = lines
    files = RunFiles(str(tmp_path / "run"))
    files.prepare()
    half = len(records) // 2
    _rewrite([_old_shape(r) for r in records[:half]], files.paths.batch(0))
    _rewrite(records[half:], files.paths.batch(1))
    assert merge(files).trajectories == N_LINES
    ds = _load(files.paths.path("trajectories.jsonl"), tmp_path, monkeypatch, chunksize=CHUNK)
    assert ds.num_rows == N_LINES
    by_index = {row["prompt_index"]: row for row in ds}
    assert by_index[0]["stop_reason"] is None and by_index[0]["usage"].get("cost") is None  # old lines: null
    assert by_index[half]["stop_reason"] == records[half]["stop_reason"]
    assert by_index[0]["identity"] is None and by_index[half]["identity"] == records[half]["identity"]
    assert by_index[half]["usage"]["cost"] == records[half]["usage"]["cost"]


def test_every_stop_reason_is_documented_where_users_read_them():
    page = (Path(__file__).resolve().parents[1] / "docs" / "output.md").read_text(encoding="utf-8")
    for reason in STOP_REASONS:
        assert f"`{reason}`" in page, f"stop reason {reason} is not described in docs/output.md"


def test_a_policy_label_first_seen_in_the_last_line_still_loads(lines, tmp_path, monkeypatch):
    # A Python caller's rollouts label their samples once it sets a policy_version (docs/rollouts.md): the label
    # may first appear on a run's last line. The merge leads with it, so datasets types the column from it.
    from agentbatch.run_dir.files import RunFiles
    from agentbatch.run_dir.merge import merge

    _, records = lines
    half = len(records) // 2
    files = RunFiles(str(tmp_path / "run"))
    files.prepare()
    _rewrite(records[:half], files.paths.batch(0))
    _rewrite([*records[half:-1], dict(records[-1], policy_version="step-3")], files.paths.batch(1))
    merge(files)
    ds = _load(files.paths.path("trajectories.jsonl"), tmp_path, monkeypatch, chunksize=CHUNK)
    assert ds.num_rows == N_LINES and ds["policy_version"].count("step-3") == 1
