"""Outcome and logprob fields keep every line loadable by `datasets` with one schema: real lines from a run,
mixed with lines from before these fields, in the worst order for a loader that types columns from the first
block it reads."""

from __future__ import annotations

import json

from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from scripted_server import ScriptedServer
from test_samples_resume import OLD_FIELDS
from test_trajectory_format import CHUNK, _load
from verify_helpers import answer, args_for, sh

from agentbatch.run_dir.files import RunFiles
from agentbatch.run_dir.merge import merge

PAD = "x" * 3000  # long prompts: a few lines fill a 16 KiB block


def real_lines(tmp_path) -> list[dict]:
    rows = [
        {"prompt": f"checked {PAD}", "verify": "test -f out.txt"},
        {"prompt": f"answered {PAD}", "answer": "42"},
        {"prompt": f"timed out {PAD}", "verify": "sleep 30"},
        {"prompt": f"plain {PAD}"},
    ]
    script = {
        rows[0]["prompt"]: [sh("echo > out.txt"), answer("made") | {"logprobs": True, "token_ids": True}],
        rows[1]["prompt"]: [answer("42")],
    }
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(script=script, default_script=[answer("ok")]) as srv:
        flags = ["--logprobs", "--samples_per_prompt=2", "--check_timeout=1"]
        assert_clean_exit(run_cli(args_for(data, tmp_path / "out", "v", *flags), tmp_path, srv))
    return RunDir(tmp_path / "out" / "v").trajectories()


def test_lines_with_and_without_outcomes_and_logprobs_load_in_any_order(tmp_path, monkeypatch):
    lines = real_lines(tmp_path)
    assert {r["check"]["status"] for r in lines} == {"passed", "timeout", "none"}
    plain = [r for r in lines if r["check"]["status"] in ("none", "timeout") and not r.get("logprobs")]
    old = [{k: v for k, v in r.items() if k not in OLD_FIELDS} for r in plain]
    rich = [r for r in lines if r["reward"] is not None]
    # First many blocks of lines with no reward, no exit code, no logprobs, no tool call (old ones among
    # them), then the lines that have them: typed from its first block, the file would not load.
    first = (old + plain) * 8
    files = RunFiles(str(tmp_path / "merged"))
    files.prepare()
    for n, batch in enumerate([first, rich]):
        with open(files.paths.batch(n), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in batch)
    assert (tmp_path / "merged" / "batch_0.jsonl").stat().st_size > 8 * CHUNK
    report = merge(files)
    assert report.trajectories == len(first) + len(rich)
    merged = [json.loads(line) for line in open(files.paths.path("trajectories.jsonl"), encoding="utf-8")]
    # The leads, from the newest batch first: an old line is not among them; together they show every kind
    # of value the file holds.
    leads = next(i for i in range(len(merged)) if merged[i] == first[0])  # the rest keeps the files' order
    assert leads >= 1 and merged[:leads] == rich[:leads] and merged[leads : leads + len(first)] == first

    ds = _load(files.paths.path("trajectories.jsonl"), tmp_path, monkeypatch, chunksize=CHUNK)
    assert ds.num_rows == len(merged)
    rewards = [r for r in ds["reward"] if r is not None]
    assert sorted(rewards) == sorted(r["reward"] for r in rich) and len(rewards) == len(rich)
    assert set(ds["passed"]) == {True, None}
    exit_codes = [c["exit_code"] for c in ds["check"] if c is not None]  # None: the old lines
    assert exit_codes.count(0) == sum(r["check"]["exit_code"] == 0 for r in rich)
    with_logprobs = [t for conv in ds["conversations"] for t in conv if t.get("logprobs")]
    assert with_logprobs and with_logprobs[0]["logprobs"]["token_ids"] == [1000, 1001, 1002, 1003]
