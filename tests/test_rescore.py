"""--rescore through the real CLI (docs/replay.md): a finished run checked again after its dataset's `answer` and
`verify` changed, without a model call; `verify` in a fresh sandbox holding the sample's kept final state
(--keep_final_state); the old check kept beside the new one; statistics, export and `datasets` see the newest; a
killed rescore loses nothing and the next one finishes it; what cannot be checked again is said."""

from __future__ import annotations

import json

import datasets
import pyarrow.parquet as pq
import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, run_cli_wrapped, write_dataset
from sandbox_support import settings_for
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, sh

SCRIPT = {
    # The model answers 41 (the row said 42: a typo in the dataset, fixed before the rescore).
    "add": [answer("20 + 21 = 41")],
    # It writes its result where a fixed verify looks: in a file it made, beside one it deleted.
    "write": [sh("printf 'seven\\n' > result.txt && rm seed.txt && mkdir -p sub && echo 1 > sub/x"), answer("done")],
    "plain": [answer("nothing to check")],
    "twice": [sh("echo hello > hello.txt"), answer("wrote it")],
}
ROWS = [
    {"prompt": "add", "answer": "42"},
    {"prompt": "write", "setup": "echo seed > seed.txt", "verify": "test -f out.txt"},
    {"prompt": "plain"},
    {"prompt": "twice", "verify": "grep -qx hello hello.txt"},  # unchanged: its check stands
]
FIXED = [
    {"prompt": "add", "answer": "41"},
    {
        "prompt": "write",
        "setup": "echo seed > seed.txt",
        "verify": "grep -qx seven result.txt && test ! -e seed.txt && test -f sub/x && echo fixed",
    },
    {"prompt": "plain", "answer": "nothing"},  # a check added where there was none
    ROWS[3],
]


def args(data, tmp_path) -> list[str]:
    """The run's flags: two samples a batch file, so a rescore replaces several files."""
    return [a if not a.startswith("--batch_size=") else "--batch_size=2" for a in args_for(data, tmp_path / "out", "r")]


def first_run(tmp_path, *extra: str, rows=ROWS, samples: int = 2):
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(script=SCRIPT) as srv:
        done = run_cli(
            [*args(data, tmp_path), f"--samples_per_prompt={samples}", *extra],
            tmp_path,
            srv,
        )
    assert_clean_exit(done)
    return data


def rescore(tmp_path, *extra: str, rows=FIXED, code: int = 0):
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    # No endpoint at all: a rescore calls no model (the default --base_url is unreachable here, and no key).
    done = run_cli([*args(data, tmp_path), "--rescore", *extra], tmp_path)
    assert_clean_exit(done, code)
    return done


def lines_by(run: RunDir) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in run.trajectories():
        out.setdefault(r["conversations"][0]["value"], []).append(r)
    return out


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_a_rescore_checks_changed_answers_and_verifies_again_and_keeps_the_old_check(tmp_path, sandbox):
    if sandbox == "bwrap":
        settings_for("bwrap")  # skips (a failure in CI) where bwrap cannot run
    first_run(tmp_path, "--keep_final_state", f"--sandbox={sandbox}")
    run = RunDir(tmp_path / "out" / "r")
    before = {k: v for k, v in lines_by(run).items()}
    assert {k: [r["passed"] for r in v] for k, v in before.items()} == {
        "add": [False, False],
        "write": [False, False],
        "plain": [None, None],
        "twice": [True, True],
    }
    batches = run.snapshot()
    assert all(len(r["checks"]) == 1 and r["final_state"] for v in before.values() for r in v)

    done = rescore(tmp_path, f"--sandbox={sandbox}")
    assert "6 samples checked again (6 now pass, 0 no longer pass, 0 as before)" in done.stdout
    assert "2 whose row is unchanged kept their check" in done.stdout
    after = lines_by(run)
    for prompt, lines in after.items():
        for line, old in zip(sorted(lines, key=_sample), sorted(before[prompt], key=_sample), strict=True):
            assert line["conversations"] == old["conversations"]  # nothing of the sample but its check changed
            if prompt == "twice":
                assert line == old
                continue
            assert len(line["checks"]) == 2 and line["checks"][0] == old["checks"][0]
            newest = line["checks"][1]
            assert (newest["reward"], newest["passed"], newest["check"]) == (
                line["reward"],
                line["passed"],
                line["check"],
            )
            assert line["identity"] != old["identity"]
    assert [r["passed"] for r in after["add"]] == [True, True]
    assert [r["check"]["output"] for r in after["write"]] == ["fixed\n", "fixed\n"]  # in the state the agent left
    assert [r["passed"] for r in after["plain"]] == [True, True]
    stats = run.stats()
    assert stats["outcomes"]["passed"] == 8 and stats["outcomes"]["checked"] == 8
    assert stats["prompts"]["done"] == 8  # every line answers its row as the row is now
    assert run.snapshot().keys() == batches.keys()  # the batch files were replaced, not appended to or added

    # Nothing to do a second time: every line's row is as the line says.
    again = rescore(tmp_path, f"--sandbox={sandbox}")
    assert "0 samples checked again" in again.stdout and "8 whose row is unchanged" in again.stdout
    # And a resume finds every sample answered: the rescored lines answer the rows as they are now.
    with ScriptedServer(script=SCRIPT) as srv:
        resumed = run_cli(
            [*args_for(tmp_path / "ds.jsonl", tmp_path / "out", "r", "--samples_per_prompt=2", "--resume")],
            tmp_path,
            srv,
        )
        assert_clean_exit(resumed)
        assert srv.requests() == []


def test_the_newest_check_is_what_exports_and_datasets_read(tmp_path):
    first_run(tmp_path, "--keep_final_state", samples=1)
    rescore(tmp_path, "--export=parquet")
    run = RunDir(tmp_path / "out" / "r")
    table = pq.read_table(tmp_path / "out" / "r" / "export" / "parquet" / "data")
    assert sorted(table.column("passed").to_pylist(), key=str) == [True, True, True, True]
    ds = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert sorted(len(c) for c in ds["checks"]) == [1, 2, 2, 2]  # one schema, whatever each line's history
    assert sorted(ds["passed"]) == [True] * 4
    rows = {r["conversations"][0]["value"]: r for r in run.trajectories()}
    assert json.loads(json.dumps(rows["add"]["checks"][0]["check"])) == rows["add"]["checks"][0]["check"]


def test_the_report_written_after_a_rescore_shows_the_newest_checks(tmp_path):
    from report_helpers import Report

    first_run(tmp_path, "--keep_final_state", samples=1)
    run = RunDir(tmp_path / "out" / "r")
    assert {r["conversations"][0]["value"]: r["passed"] for r in run.trajectories()}["add"] is False
    rescore(tmp_path, "--report")
    report = Report(run.path / "report.html")
    statuses = report.data["statuses"]
    assert [statuses[s] for s in report.column("status")] == ["passed"] * 4
    shown = {p: item["check"] for p, item in zip(report.column("pindex"), report.items, strict=True)}
    assert shown == {r["prompt_index"]: r["check"] for r in run.trajectories()}
    assert report.run()["statistics"]["outcomes"] == run.stats()["outcomes"]
    assert run.stats()["outcomes"]["passed"] == 4


def test_without_a_kept_state_only_answers_are_checked_again_and_the_rest_is_said(tmp_path):
    first_run(tmp_path, samples=1)
    done = rescore(tmp_path)
    assert "1 whose check needs a final state this run did not keep (--keep_final_state)" in done.stderr
    lines = lines_by(RunDir(tmp_path / "out" / "r"))
    assert lines["add"][0]["passed"] is True and len(lines["add"][0]["checks"]) == 2
    assert lines["write"][0]["passed"] is False and len(lines["write"][0]["checks"]) == 1  # as it was
    assert lines["plain"][0]["passed"] is True


def test_a_killed_rescore_loses_nothing_and_the_next_one_finishes_it(tmp_path):
    """Killed after replacing its first batch file: that file's lines carry their new check, the others none
    yet; the next rescore checks only those, and every line ends with exactly one new check."""
    first_run(tmp_path, "--keep_final_state")
    run = RunDir(tmp_path / "out" / "r")
    kill_on_second = (
        "import os\n"
        "from agentbatch.run_dir.files import RunFiles\n"
        "_replace, _calls = RunFiles.replace_lines, []\n"
        "def replace_lines(self, path, changed):\n"
        "    _calls.append(path)\n"
        "    if len(_calls) == 2:\n"
        "        os._exit(9)\n"
        "    return _replace(self, path, changed)\n"
        "RunFiles.replace_lines = replace_lines\n"
    )
    data = write_dataset(tmp_path / "ds.jsonl", FIXED)
    killed = run_cli_wrapped(kill_on_second, [*args(data, tmp_path), "--rescore"], tmp_path)
    assert killed.returncode == 9, killed.stderr
    partly = [len(r["checks"]) for r in run.batch_records()]
    assert 2 in partly and partly.count(2) < 6  # one file done, the others not yet
    done = rescore(tmp_path)
    assert f"{6 - partly.count(2)} samples checked again" in done.stdout
    assert sorted(len(r["checks"]) for r in run.batch_records()) == [1, 1, 2, 2, 2, 2, 2, 2]
    assert sorted(len(r["checks"]) for r in run.trajectories()) == [1, 1, 2, 2, 2, 2, 2, 2]
    assert run.stats()["outcomes"]["passed"] == 8


def test_a_rescore_needs_a_finished_run_and_refuses_resume(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    done = run_cli([*args_for(data, tmp_path / "out", "none"), "--rescore"], tmp_path)
    assert done.returncode == 2 and "holds no run to rescore" in done.stderr and "Traceback" not in done.stderr
    refused = run_cli([*args_for(data, tmp_path / "out", "none"), "--rescore", "--resume"], tmp_path)
    assert refused.returncode == 2 and "drop --resume" in refused.stderr


def test_a_rescore_without_its_dataset_is_refused_not_taken_for_an_export(tmp_path):
    """--rescore --run_name --export without --dataset_file would else export the run as it was, rescored in no way."""
    first_run(tmp_path, samples=1)
    run = RunDir(tmp_path / "out" / "r")
    before = sorted(p.read_text() for p in run.path.glob("batch_*.jsonl"))
    done = run_cli(["--run_name=r", f"--output_dir={tmp_path / 'out'}", "--rescore", "--export=openai"], tmp_path)
    assert done.returncode == 2 and "--rescore needs --dataset_file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (run.path / "export").exists()
    assert sorted(p.read_text() for p in run.path.glob("batch_*.jsonl")) == before


def _sample(line: dict) -> int:
    return line["sample_index"]


def test_a_line_from_before_checks_gets_its_own_check_first(tmp_path):
    """Lines an older runner wrote have no `checks`: their own check becomes the first, right after `check`."""
    first_run(tmp_path, samples=1)
    run = RunDir(tmp_path / "out" / "r")
    for path in run.path.glob("batch_*.jsonl"):
        old = [json.loads(line) for line in path.read_text().splitlines()]
        for r in old:
            del r["checks"], r["final_state"]
        path.write_text("".join(json.dumps(r) + "\n" for r in old))
    rescore(tmp_path)
    (line,) = [r for r in run.batch_records() if r["conversations"][0]["value"] == "add"]
    assert [c["passed"] for c in line["checks"]] == [False, True]
    assert line["checks"][0]["checked_at"] == line["metadata"]["timestamp"]
    keys = list(line)
    assert keys[keys.index("check") + 1] == "checks"
    # Old lines without `checks` (not checked again: unchanged, or no state) load beside those with one.
    ds = datasets.load_dataset("json", data_files=str(run.path / "trajectories.jsonl"), split="train")
    assert sorted(len(c or ()) for c in ds["checks"]) == [0, 0, 2, 2]
