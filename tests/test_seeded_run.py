"""A seeded run on the scripted server, through the real CLI, gives exactly the pinned output.

Every file of the run (trajectories, batches, discards, failures, statistics) is compared with
tests/fixtures/seeded_run.json, timestamps and durations aside. A change to what a run writes must be
deliberate: regenerate the fixture with `python tests/test_seeded_run.py` and review its diff.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from cli_helpers import run_cli, write_dataset
from scripted_server import ScriptedServer

FIXTURE = Path(__file__).parent / "fixtures" / "seeded_run.json"
UNSTABLE = ("timestamp", "updated_at", "duration_seconds", "seconds", "checked_at")


def _thinking(content: str = "done", **kw) -> dict:
    return {"content": content, "reasoning": "thinking: " + content, **kw}


def _call(name: str, args: dict, **kw) -> dict:
    return {"reasoning": f"call {name}", "tool_calls": [{"name": name, "arguments": args}], **kw}


SCRIPT = {
    "p-terminal": [_call("terminal", {"command": "echo hello; echo err >&2; exit 3"}), _thinking("terminal ok")],
    "p-files": [
        _call("write_file", {"path": "a/b.txt", "content": "x = 1\nTODO here\n"}),
        _call("patch", {"path": "a/b.txt", "old_string": "x = 1", "new_string": "x = 2"}),
        _call("read_file", {"path": "a/b.txt"}),
        _call("search_files", {"pattern": "TODO"}),
        _thinking("files ok"),
    ],
    "p-badjson": [
        {"reasoning": "x", "tool_calls": [{"name": "terminal", "arguments": "{not json"}]},
        _thinking("recovered"),
    ],
    "p-unknown": [{"reasoning": "x", "tool_calls": [{"name": "no_such_tool", "arguments": {}}]}],
    "p-noreason": [{"content": "plain answer"}],
    "p-fail": [{"fault": "400", "fault_times": -1}],
    "p-ctx": [_call("terminal", {"command": "true"}), {"fault": "context_length", "fault_times": -1}],
    "p-length": [{"content": "cut", "reasoning": "r", "finish_reason": "length"}],
    "p-private": [_call("web_extract", {"urls": ["http://127.0.0.1:1/x"]}), _thinking("refused")],
    "p-maxturns": [_call("terminal", {"command": "echo loop"})],
    "p-parallel": [
        {
            "reasoning": "two",
            "tool_calls": [
                {"name": "terminal", "arguments": {"command": "echo one"}},
                {"name": "terminal", "arguments": {"command": "echo two"}},
            ],
        },
        _thinking("both"),
    ],
    "p-dup": [_thinking("dup answer")],
    "p-check": [_call("terminal", {"command": "echo made > made.txt"}), _thinking("made it")],
}
# The last row carries a check (README, "Verified outcomes"), so the pinned output holds a verified line.
PROMPTS = [*SCRIPT, "p-dup", "p-default"]
PROMPTS.remove("p-check")
PROMPTS.append({"prompt": "p-check", "verify": "grep -q made made.txt && echo checked", "answer": "made it"})


def _normalised(value):
    if isinstance(value, dict):
        return {k: "T" if k in UNSTABLE else _normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    return value


def seeded_run(work: Path) -> dict:
    """Run the seeded dataset and return every output file, normalised and in a stable order."""
    with ScriptedServer(script=SCRIPT, default_script=[_thinking("default {prompt}")]) as srv:
        dataset = write_dataset(work / "ds.jsonl", PROMPTS)
        args = [f"--dataset_file={dataset}", "--batch_size=3", "--run_name=golden", f"--output_dir={work}", "--seed=7"]
        args += ["--num_workers=2", "--concurrency=4", "--max_turns=4", "--max_retries=1"]
        done = run_cli(args, work, srv)
    out: dict = {"exit": done.returncode}
    run = work / "golden"
    for name in sorted(os.listdir(run)):
        if name.endswith(".jsonl"):
            lines = [_normalised(json.loads(line)) for line in (run / name).read_text().splitlines() if line.strip()]
            out[name] = sorted(lines, key=lambda x: json.dumps(x, sort_keys=True))
        elif name == "statistics.json":
            out[name] = _normalised(json.loads((run / name).read_text()))
    return out


def test_a_seeded_run_writes_exactly_the_pinned_output(tmp_path):
    assert seeded_run(tmp_path) == json.loads(FIXTURE.read_text(encoding="utf-8"))


if __name__ == "__main__":  # regenerate the fixture
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(seeded_run(Path(tmp)), indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"wrote {FIXTURE}")
