"""Real runs for the report tests, made by the real CLI against the scripted server: checked rows (pass, fail,
partial credit, a check that passes some samples and not others), tool calls (one failing), three samples a
prompt, a prompt that always fails, one discarded for want of reasoning, and hostile text."""

from __future__ import annotations

import base64
import gzip
import json
import re
import shutil
import subprocess
from pathlib import Path

from cli_helpers import assert_clean_exit, read_jsonl, run_cli, write_dataset
from scripted_server import ScriptedServer

SAMPLES = 3
MEGABYTE = "0123456789abcdef" * 65536  # 1 MiB of output in one reply

# Text that would run if the page ever took a run's text for markup or a link.
HOSTILE_PROMPT = '<b>bold</b><img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>'
HOSTILE_ANSWER = (
    '<a href="javascript:window.__pwned=3">click</a> [link](javascript:window.__pwned=4) '
    '</script><script>window.__pwned=5</script><svg onload="window.__pwned=6"></svg> <!-- end\n'
)

HOSTILE_TOOL_TEXT = '<i>tool</i></script><script>window.__pwned=7</script><iframe src="javascript:window.__pwned=8">'


def think(content: str, **extra) -> dict:
    return {"content": content, "reasoning": f"thinking about {content[:40]}", **extra}


def call(name: str, args: dict, **extra) -> dict:
    return {"reasoning": f"I will call {name}", "tool_calls": [{"name": name, "arguments": args}], **extra}


def rows(counter_dir: Path) -> list[dict]:
    # A check passing every other sample: each takes the next number (mkdir is atomic) in a directory outside
    # the sandbox, and odd numbers pass.
    mixed = f'i=1; while ! mkdir "{counter_dir}/$i" 2>/dev/null; do i=$((i+1)); done; test $((i % 2)) = 1'
    return [
        {"prompt": "r-pass: what is 6*7?", "answer": "42"},
        {"prompt": "r-fail: what is 6*7?", "answer": "42"},
        {"prompt": "r-mixed: say hi in a file", "verify": mixed},
        {"prompt": "r-toolfail: read a missing file", "verify": "true"},
        {"prompt": "r-partial: half credit", "verify": """echo '{"reward": 0.5}'"""},
        {"prompt": "r-nocheck: answer with hostile text"},
        {"prompt": "r-error: always rejected"},
        {"prompt": "r-noreason: no reasoning"},
        {"prompt": HOSTILE_PROMPT},
    ]


SCRIPT = {
    "r-pass: what is 6*7?": [think("The answer is 42.")],
    "r-fail: what is 6*7?": [think("It is 41.")],
    "r-mixed: say hi in a file": [call("terminal", {"command": "echo hi > hi.txt; echo wrote"}), think("done")],
    "r-toolfail: read a missing file": [call("read_file", {"path": "no/such/file.txt"}), think("it is missing")],
    "r-partial: half credit": [think("half done")],
    "r-nocheck: answer with hostile text": [think(HOSTILE_ANSWER + MEGABYTE)],
    "r-error: always rejected": [{"fault": "400", "fault_times": -1}],
    "r-noreason: no reasoning": [{"content": "no thoughts"}],
    # File tools: with --seed=7 this row is offered vision and file (a row's toolsets are seeded by its index).
    HOSTILE_PROMPT: [
        call("write_file", {"path": "x.html", "content": HOSTILE_TOOL_TEXT}),
        call("read_file", {"path": "x.html"}),
        think(HOSTILE_ANSWER),
    ],
}
# A second model: passes r-fail, fails r-pass, and makes no tool call.
SCRIPT_B = dict(SCRIPT)
SCRIPT_B["r-pass: what is 6*7?"] = [think("Perhaps 48.")]
SCRIPT_B["r-fail: what is 6*7?"] = [think("6*7 = 42")]
SCRIPT_B["r-mixed: say hi in a file"] = [think("nothing written")]


def run_args(dataset: Path, out: Path, name: str, *extra: str) -> list[str]:
    return [
        f"--dataset_file={dataset}",
        "--batch_size=4",
        f"--run_name={name}",
        f"--output_dir={out}",
        "--distribution=development",  # toolsets vary from prompt to prompt (seeded)
        "--seed=7",
        "--sandbox=local",
        f"--samples_per_prompt={SAMPLES}",
        "--max_retries=1",
        "--num_workers=2",
        "--concurrency=4",
        "--max_turns=4",
        "--check_timeout=20",
        *extra,
    ]


def make_run(out: Path, name: str = "model_a", script: dict | None = None, rows_kept=None, *extra: str):
    """Run the dataset through the real CLI; returns (run dir, the CLI's finished process)."""
    counter = out / f"{name}-counter"
    counter.mkdir(parents=True)
    data = rows(counter) if rows_kept is None else [r for r in rows(counter) if rows_kept(r)]
    dataset = write_dataset(out / f"{name}.jsonl", data)
    with ScriptedServer(script=script or SCRIPT, default_script=[think("default")]) as srv:
        done = run_cli(run_args(dataset, out, name, *extra), out, srv)
    assert_clean_exit(done, 3)  # r-error fails every attempt
    return out / name, done


def report_cli(out: Path, name: str, *flags: str) -> subprocess.CompletedProcess:
    """`python batch_runner.py --run_name=NAME --output_dir=OUT --report ...` (no dataset: report only)."""
    return run_cli([f"--run_name={name}", f"--output_dir={out}", *flags], out)


def lines_of(run_dir: Path) -> list[tuple[str, dict]]:
    """(kind, record) of every line the report lists, in its order: batch files, discards, failed attempts."""
    numbers = sorted(int(p.stem.split("_")[1]) for p in run_dir.glob("batch_*.jsonl"))
    out = [("trajectory", r) for n in numbers for r in read_jsonl(run_dir / f"batch_{n}.jsonl")]
    out += [("discarded", r) for r in read_jsonl(run_dir / "discarded.jsonl")]
    out += [("failed", r) for r in read_jsonl(run_dir / "failed.jsonl")]
    return out


def categorised_copy(run: Path, dest: Path) -> Path:
    """The run with a task category in every line's metadata, as a Harbor task's lines carry theirs."""
    shutil.copytree(run, dest)
    for path in [*dest.glob("batch_*.jsonl"), dest / "discarded.jsonl"]:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            kind = "arithmetic" if "6*7" in r["conversations"][0]["value"] else "files"
            r["metadata"]["task"] = {"name": "t", "category": kind, "difficulty": "easy"}
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return dest


def statistics(run_dir: Path) -> dict:
    return json.loads((run_dir / "statistics.json").read_text(encoding="utf-8"))


def _between(text: str, start: str, end: str = "</script>") -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


def _gunzip(b64: str):
    return json.loads(gzip.decompress(base64.b64decode(b64)))


class Report:
    """A written report.html read back: its figures (`data`), its index, and every line's content (`items`)."""

    def __init__(self, path: Path):
        self.path = path
        self.text = path.read_text(encoding="utf-8")
        self.data = json.loads(_between(self.text, '<script type="application/json" id="report-data">'))
        self.index = json.loads(_between(self.text, '<script type="application/json" id="report-index">'))
        chunks = re.findall(r'<script type="application/x-gzip-base64" id="c(\d+)">([^<]*)</script>', self.text)
        assert [int(n) for n, _ in chunks] == list(range(len(self.data["chunk_starts"])))
        self.items = [item for _, b64 in chunks for item in _gunzip(b64)]

    def run(self, i: int = 0) -> dict:
        return self.data["runs"][i]

    def column(self, name: str) -> list:
        return self.index["columns"][name]
