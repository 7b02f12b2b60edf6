"""The run's last samples: once no sample is left to hand out, each worker is told so (executors: HandedOut), and
its pacers stay at CUT of their ceilings (test_rate_limit): a call refused then would wait its Retry-After at the
run's end."""

from __future__ import annotations

import json

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from scripted_server import ScriptedServer

TOLD = '''
from agentbatch import ToolContext, tool
from agentbatch.model import rate_limit


@tool
def told_last(ctx: ToolContext) -> dict:
    """Whether this sample's worker was told its samples are the run's last."""
    return {"output": str(rate_limit._last_samples.is_set())}
'''


@pytest.mark.parametrize("executor", ["processes", pytest.param("ray", marks=pytest.mark.slow)])
def test_each_worker_is_told_once_every_sample_is_handed_out(tmp_path, executor):
    if executor == "ray":
        pytest.importorskip("ray")
    (tmp_path / "told.py").write_text(TOLD)
    prompts = [f"prompt {i}" for i in range(6)]
    write_dataset(tmp_path / "ds.jsonl", prompts)
    told_last = {"reasoning": "r", "tool_calls": [{"name": "told_last", "arguments": {}}]}
    script = [told_last, {"content": "done"}]
    # The last sample's first answer is slow: the others are all back before it asks.
    scripts = {prompts[-1]: [dict(told_last, latency=1.0), {"content": "done"}]}
    args = ["--dataset_file=ds.jsonl", "--run_name=last", "--batch_size=6", "--sandbox=local", "--num_workers=2"]
    args += ["--concurrency=2", f"--tools={tmp_path / 'told.py'}", "--require_reasoning=false"]
    args += ["--ray_address=local"] if executor == "ray" else []
    with ScriptedServer(script=scripts, default_script=script, latency=0.05) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc, 0)
    told = {}
    for line in RunDir(tmp_path / "data" / "last").trajectories():
        (answer,) = [json.loads(t["value"]) for t in line["conversations"] if t["from"] == "tool"]
        told[prompts.index(line["conversations"][0]["value"])] = answer["output"]
    # Two slots: the sixth sample is handed out once four have come back, and the run finds none left when a
    # fifth comes back: the first five asked before; the sixth, the run's last, after its worker was told.
    assert [told[i] for i in range(6)] == ["False"] * 5 + ["True"], told
