"""--samples_per_prompt and --resume: identity is (prompt text, occurrence, sample index)."""

from __future__ import annotations

import json
from collections import Counter

from cli_helpers import (
    RunDir,
    assert_clean_exit,
    first_turn_prompts,
    prompt_of_record,
    read_jsonl,
    run_cli,
    write_dataset,
)
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for

OLD_FIELDS = ("sample_index", "stop_reason", "reward", "passed", "check")


def samples(run: RunDir) -> Counter:
    """(prompt, sample index) → lines answering it in trajectories.jsonl and discarded.jsonl."""
    return Counter((prompt_of_record(r), r.get("sample_index", 0)) for r in run.trajectories() + run.discarded())


def test_resume_runs_exactly_the_failed_samples_of_duplicated_prompts(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ["dup", "flaky", "dup"])
    # The first two requests for "flaky" fail (no retries): two of its three samples fail, one is done.
    script = {"flaky": [answer("ok") | {"fault": "500", "fault_times": 2}]}
    with ScriptedServer(script=script, default_script=[answer("ok")]) as srv:
        args = args_for(data, tmp_path / "out", "v", "--samples_per_prompt=3")
        first = run_cli(args, tmp_path, srv)
        assert_clean_exit(first, 3)
        run = RunDir(tmp_path / "out" / "v")
        failed = sorted(f["sample_index"] for f in run.failed())
        assert len(failed) == 2 and all(f["prompt"] == "flaky" for f in run.failed())
        done_before = {r["sample_index"] for r in run.trajectories() if prompt_of_record(r) == "flaky"}
        assert sorted([*failed, *done_before]) == [0, 1, 2]
        asked = len(srv.requests())
        second = run_cli([*args, "--resume"], tmp_path, srv)
        assert_clean_exit(second)
        assert first_turn_prompts(srv, since=asked) == Counter({"flaky": 2})
    assert "3 prompts × 3 samples, 7 already done, 2 to run" in second.stderr
    last = read_jsonl(run.path / f"batch_{run.batch_numbers()[-1]}.jsonl")  # what the second session wrote
    assert sorted(r["sample_index"] for r in last) == failed
    assert samples(run) == Counter({**{("dup", s): 2 for s in range(3)}, **{("flaky", s): 1 for s in range(3)}})
    assert run.stats()["prompts"] == {"total": 9, "done": 9, "discarded": 0, "failed": 0, "not_run": 0}


def test_more_samples_on_resume_over_lines_written_before_samples_existed(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "p", "verify": "true"}, {"prompt": "q", "answer": "yes"}])
    with ScriptedServer(default_script=[answer("yes")]) as srv:
        assert_clean_exit(run_cli(args_for(data, tmp_path / "out", "v"), tmp_path, srv))
        run = RunDir(tmp_path / "out" / "v")
        # Rewrite the batch file as an older version would have written it: no sample, stop or outcome fields.
        (batch,) = run.path.glob("batch_*.jsonl")
        old = [
            {k: v for k, v in json.loads(line).items() if k not in OLD_FIELDS}
            for line in batch.read_text().splitlines()
        ]
        batch.write_text("".join(json.dumps(r) + "\n" for r in old))
        asked = len(srv.requests())
        more = run_cli([*args_for(data, tmp_path / "out", "v", "--samples_per_prompt=3"), "--resume"], tmp_path, srv)
        assert_clean_exit(more)
        assert first_turn_prompts(srv, since=asked) == Counter({"p": 2, "q": 2})
    assert "2 prompts × 3 samples, 2 already done, 4 to run" in more.stderr
    assert samples(run) == Counter({(p, s): 1 for p in "pq" for s in range(3)})
    o = run.stats()["outcomes"]
    # The old lines carry no check result: they count as unchecked, the new samples as checked.
    assert (o["checked"], o["passed"], o["unchecked"], o["pass_at_k_prompts"]) == (4, 4, 2, {"1": 2, "2": 2})
