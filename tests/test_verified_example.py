"""The README's verified example, run verbatim offline with the embedded model: every sample checked in its
sandbox, and statistics that agree with the lines."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from collections import Counter

import pytest
from cli_helpers import ROOT, RunDir, cli_env
from test_local_model import _copy_repo, _wait_gone
from verify_helpers import expected_pass_at_k

README = (ROOT / "README.md").read_text(encoding="utf-8")
COMMAND = next(
    line.strip() for line in README.splitlines() if "data/verified_example.jsonl" in line and "python" in line
)


def test_the_example_rows_carry_setup_verify_and_answer():
    rows = [json.loads(line) for line in (ROOT / "data" / "verified_example.jsonl").read_text().splitlines()]
    assert len(rows) >= 5
    assert all(any(k in r for k in ("verify", "answer")) for r in rows)
    assert sum("setup" in r for r in rows) >= 2 and sum("verify" in r for r in rows) >= 2
    assert any("reward" in r.get("verify", "") for r in rows)  # one gives partial credit


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python[server] is not installed")
@pytest.mark.slow
def test_the_readme_example_checks_every_sample_offline(tmp_path):
    repo = _copy_repo(tmp_path / "repo")
    done = subprocess.run(COMMAND, shell=True, cwd=repo, env=cli_env(), capture_output=True, text=True, timeout=3600)
    assert done.returncode in (0, 3), done.stderr[-3000:]
    assert _wait_gone(repo, 10) == []
    samples = int(re.search(r"--samples_per_prompt=(\d+)", COMMAND).group(1))
    rows = [json.loads(line) for line in (repo / "data" / "verified_example.jsonl").read_text().splitlines()]
    run = RunDir(repo / "data" / "verified")
    lines, failed = run.trajectories(), run.failed()
    assert not any("setup failed" in f["error"] for f in failed), failed
    ended = Counter((r["prompt_index"], r["sample_index"]) for r in lines) + Counter(
        (f["prompt_index"], f["sample_index"]) for f in failed
    )
    assert set(ended) == {(i, s) for i in range(len(rows)) for s in range(samples)}
    assert len(lines) >= len(rows) * samples - 2, [f["error"] for f in failed]
    for r in lines:  # every check gave a result, by the rule of its row
        row, check = rows[r["prompt_index"]], r["check"]
        assert check["status"] in ("passed", "failed"), check
        assert (check["exit_code"] is not None) == ("verify" in row)
        assert (check["answer_matched"] is not None) == ("answer" in row)
        assert r["passed"] is (check["status"] == "passed")
        if "reward" in row.get("verify", ""):
            assert r["reward"] == json.loads(check["output"].splitlines()[-1])["reward"]
    o = run.stats()["outcomes"]
    passes = sum(r["passed"] for r in lines)
    assert (o["checked"], o["passed"], o["samples_per_prompt"]) == (len(lines), passes, samples)
    per_prompt = Counter(r["prompt_index"] for r in lines)
    results = [(n, sum(r["passed"] for r in lines if r["prompt_index"] == i)) for i, n in per_prompt.items()]
    assert o["pass_at_k"]["1"] == round(expected_pass_at_k(results, 1), 4)
    assert f"checks: {passes} passed, {len(lines) - passes} not passed" in done.stdout
