"""Verified outcomes through the real CLI in local sandboxes: rewards, pass rates and pass@k from a scripted model
that solves some samples and not others; a hanging check; the key out of reach of checks; setup; --require_pass."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from cli_helpers import RunDir, assert_clean_exit, first_turn_prompts, run_cli, write_dataset
from helpers import SequencedServer
from sandbox_support import wait_gone
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, by_prompt, expected_pass_at_k, sh

THIRDS = 'n=0; for f in a b c; do [ -f $f ] && n=$((n+1)); done; echo "{\\"reward\\": $(awk "BEGIN{print $n/3}"), \\"passed\\": $n, \\"total\\": 3}"'
SAMPLES = 4
# Each prompt's first reply, as its 4 samples ask for it (in whatever order they do): the first spec, then "then".
SCRIPT = {
    "file": [
        sh("echo 42 > out.txt") | {"then": [sh("echo 41 > out.txt"), sh("echo 42 > out.txt"), answer("no")]},
        answer("done"),
    ],
    "thirds": [sh("touch a b c") | {"then": [sh("touch a"), sh("touch a b c"), answer("no files")]}, answer("done")],
    "multiply": [answer("17*23 = 391.") | {"then": [answer("It is 3910"), answer("391"), answer("no idea")]}],
    "both": [
        sh("touch done.txt") | {"then": [answer("finished"), sh("touch other.txt"), answer("gave up")]},
        answer("finished"),
    ],
    "always": [answer("yes")],
    "never": [answer("no")],
    "unchecked": [answer("whatever")],
}
ROWS = [
    {"prompt": "file", "verify": "grep -qx 42 out.txt"},
    {"prompt": "thirds", "verify": THIRDS},
    {"prompt": "multiply", "answer": "391"},
    {"prompt": "both", "verify": "test -f done.txt", "answer": ["finished", "complete"]},
    {"prompt": "always", "verify": "true"},
    {"prompt": "never", "verify": "echo nope; false"},
    {"prompt": "unchecked"},
]
# (reward, passed) of the 4 samples of each prompt, whichever sample got which reply.
EXPECTED = {
    "file": Counter({(1.0, True): 2, (0.0, False): 2}),
    "thirds": Counter({(1.0, True): 2, (0.333333, False): 1, (0.0, False): 1}),
    "multiply": Counter({(1.0, True): 2, (0.0, False): 2}),
    "both": Counter({(1.0, True): 1, (0.0, False): 3}),
    "always": Counter({(1.0, True): 4}),
    "never": Counter({(0.0, False): 4}),
    "unchecked": Counter({(None, None): 4}),
}
# 15 tokens per model call (the scripted server's usage); samples that ran a command made two calls.
TOKENS_OF_CHECKED = 15 * (7 + 7 + 4 + 6 + 4 + 4)


def test_rewards_pass_rate_and_pass_at_k_are_exactly_what_the_samples_earned(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ROWS)
    with SequencedServer(script=SCRIPT) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", f"--samples_per_prompt={SAMPLES}"), tmp_path, srv)
    assert_clean_exit(done)
    run = RunDir(tmp_path / "out" / "v")
    lines = by_prompt(run.trajectories())
    assert sorted(lines) == sorted(EXPECTED)
    for prompt, records in lines.items():
        got = Counter((None if r["reward"] is None else round(r["reward"], 6), r["passed"]) for r in records)
        assert got == EXPECTED[prompt], prompt
        assert sorted(r["sample_index"] for r in records) == list(range(SAMPLES)), prompt
        assert len({r["prompt_index"] for r in records}) == 1
    assert [r["check"]["output"] for r in lines["never"]] == ["nope\n"] * 4
    assert {r["check"]["exit_code"] for r in lines["never"]} == {1}
    assert all(r["check"]["status"] == "none" and r["check"]["exit_code"] is None for r in lines["unchecked"])
    assert all(r["check"]["exit_code"] is None for r in lines["multiply"])  # an answer check runs no command
    both = {(r["check"]["answer_matched"], r["check"]["exit_code"], r["passed"]) for r in lines["both"]}
    assert both <= {(True, 0, True), (True, 1, False), (False, 1, False), (False, 0, False)}
    thirds = sorted(r["check"]["output"] for r in lines["thirds"])
    assert thirds[0] == '{"reward": 0, "passed": 0, "total": 3}\n'

    results = [(n, c) for n, c in ((4, 2), (4, 2), (4, 2), (4, 1), (4, 4), (4, 0))]
    o = run.stats()["outcomes"]
    assert o["samples_per_prompt"] == SAMPLES
    counts = (o["checked"], o["passed"], o["not_passed"], o["unchecked"], o["timeout"], o["error"])
    assert counts == (24, 11, 13, 4, 0, 0)
    assert o["failed"] == o["not_passed"]  # its old name, kept one release (docs/output.md)
    assert o["pass_rate"] == round(11 / 24, 4)
    assert o["mean_reward"] == round((2 + 2.333333 + 2 + 1 + 4) / 24, 4)
    assert o["prompts_checked"] == 6
    assert o["pass_at_k"] == {str(k): round(expected_pass_at_k(results, k), 4) for k in range(1, 5)}
    assert o["pass_at_k"]["4"] == round(5 / 6, 4)  # every prompt but "never" passed at least once
    assert o["pass_at_k_prompts"] == {"1": 6, "2": 6, "3": 6, "4": 6}
    assert o["tokens_per_pass"] == round(TOKENS_OF_CHECKED / 11, 1)
    # terminal_only offers terminal and file to every prompt: both toolsets see every sample.
    assert o["by_toolset"]["terminal"] == o["by_toolset"]["file"] == {k: o[k] for k in o["by_toolset"]["file"]}
    stats = run.stats()
    assert stats["samples"] == stats["prompts"] == {"total": 28, "done": 28, "discarded": 0, "failed": 0, "not_run": 0}

    assert "7 prompts × 4 samples in the dataset" in done.stdout
    assert (
        "checks: 11 passed, 13 not passed, 0 timed out, 0 could not run, 4 without a check; pass rate 45.8%"
        in done.stdout
    )
    assert (
        f"pass@1 {o['pass_at_k']['1']:.3f}  pass@2 {o['pass_at_k']['2']:.3f}  pass@4 0.833  over 6 prompts"
        in done.stdout
    )


def test_a_hanging_check_is_killed_at_its_timeout_and_recorded_apart_from_a_fail(tmp_path):
    naps = 300 + uuid.uuid4().int % 10**6  # the hanging sleep, told apart from any other by its length
    rows = [
        {"prompt": "hangs", "verify": f"echo started; sleep {naps}; echo never"},
        {"prompt": "fails", "verify": "exit 1"},
        {"prompt": "passes", "verify": "exit 0"},
    ]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(default_script=[answer("ok")]) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", "--check_timeout=2", "--require_pass"), tmp_path, srv)
    assert_clean_exit(done)
    run = RunDir(tmp_path / "out" / "v")
    kept = by_prompt(run.trajectories())
    discarded = by_prompt(run.discarded())
    assert sorted(kept) == ["passes"] and sorted(discarded) == ["fails", "hangs"]
    hung = discarded["hangs"][0]
    assert hung["discard_reason"] == "check_timeout" and discarded["fails"][0]["discard_reason"] == "check_failed"
    assert hung["reward"] is None and hung["passed"] is None
    assert hung["check"]["status"] == "timeout" and hung["check"]["exit_code"] is None
    assert hung["check"]["output"] == "started\n" and hung["check"]["seconds"] >= 2
    assert wait_gone(str(naps), 30) == [], "the hanging check outlived its timeout"
    o = run.stats()["outcomes"]
    # A timeout gave no result: it is checked and not passed (reward 0), and counted apart from the fail.
    assert (o["checked"], o["passed"], o["failed"], o["timeout"], o["error"]) == (3, 1, 1, 1, 0)
    assert "1 timed out" in done.stdout


def test_a_check_cannot_read_the_runners_key(tmp_path):
    secret = f"BRSECRET{uuid.uuid4().hex}"
    visible = f"BRVISIBLE{uuid.uuid4().hex}"  # not credential-like: left in the runner's environment

    def probe(pattern: str) -> str:
        # The pattern matches the marker but not itself, so the probe does not find its own command line.
        return (
            f"if (env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n') | grep -aq '{pattern}'; "
            "then echo FOUND; exit 1; fi; echo scan-done"
        )

    rows = [{"prompt": "key", "verify": probe("BRSECRE[T]")}, {"prompt": "control", "verify": probe("BRVISIBL[E]")}]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(default_script=[answer("ok")]) as srv:
        args = args_for(data, tmp_path / "out", "v", f"--api_key={secret}", f"--base_url={srv.base_url}")
        done = run_cli(args, tmp_path, env={"BR_PLAIN_MARKER": visible, "OPENAI_API_KEY": secret})
    assert_clean_exit(done)
    run_dir = tmp_path / "out" / "v"
    lines = by_prompt(RunDir(run_dir).trajectories())
    # The control proves the probe reads the runner's processes: it finds what is not a secret.
    assert (lines["control"][0]["passed"], lines["control"][0]["check"]["output"]) == (False, "FOUND\n")
    assert (lines["key"][0]["passed"], lines["key"][0]["check"]["output"]) == (True, "scan-done\n")
    hits = [p.name for p in run_dir.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not hits and secret not in done.stdout + done.stderr


def test_setup_runs_before_the_agent_and_a_failed_setup_spends_nothing(tmp_path):
    rows = [
        {"prompt": "given", "setup": "mkdir -p in && echo from-setup > in/given.txt", "verify": "test -f result.txt"},
        {"prompt": "broken", "setup": "echo cannot fetch the repo >&2; exit 4", "verify": "true"},
    ]
    script = {"given": [sh("cat in/given.txt && cp in/given.txt result.txt"), answer("copied")]}
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(script=script, default_script=[answer("never asked")]) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v"), tmp_path, srv)
        asked = first_turn_prompts(srv)
    assert_clean_exit(done, 3)
    run = RunDir(tmp_path / "out" / "v")
    (given,) = run.trajectories()
    assert json.loads(given["conversations"][2]["value"])["output"] == "from-setup\n"
    assert given["passed"] is True
    (failed,) = run.failed()
    assert failed["prompt"] == "broken" and failed["sample_index"] == 0
    assert failed["error"] == "setup failed with exit code 4: cannot fetch the repo"
    assert failed["usage"]["total_tokens"] == 0 and asked == Counter({"given": 1})


def test_require_pass_keeps_passes_only_and_resume_does_not_rerun_the_discarded(tmp_path):
    rows = [{"prompt": "good", "verify": "true"}, {"prompt": "bad", "answer": "yes"}, {"prompt": "plain"}]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(default_script=[answer("no")]) as srv:
        args = args_for(data, tmp_path / "out", "v", "--require_pass", "--samples_per_prompt=2")
        assert_clean_exit(run_cli(args, tmp_path, srv))
        asked = len(srv.requests())
        again = run_cli([*args, "--resume"], tmp_path, srv)
        assert len(srv.requests()) == asked == 6
    assert_clean_exit(again)
    assert "3 prompts × 2 samples, 6 already done, 0 to run" in again.stderr
    run = RunDir(tmp_path / "out" / "v")
    assert Counter(r["conversations"][0]["value"] for r in run.trajectories()) == Counter({"good": 2})
    reasons = Counter((r["conversations"][0]["value"], r["discard_reason"]) for r in run.discarded())
    assert reasons == Counter({("bad", "check_failed"): 2, ("plain", "no_check"): 2})
    o = run.stats()["outcomes"]
    assert (o["checked"], o["passed"], o["pass_rate"], o["unchecked"]) == (4, 2, 0.5, 2)
    assert run.stats()["discard_reasons"] == {"check_failed": 2, "no_check": 2}


def test_require_pass_without_any_check_is_refused_before_anything_starts(tmp_path):
    data = write_dataset(tmp_path / "ds.jsonl", ["one", "two"])
    done = run_cli(args_for(data, tmp_path / "out", "v", "--require_pass", "--api_key=k"), tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f'error: --require_pass keeps only samples that pass their check, but no row of {data} has a "verify" or '
        '"answer" field; add checks to the rows or drop --require_pass'
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--samples_per_prompt=0", "--check_timeout=-1", "--check_timeout=soon"])
def test_bad_values_of_the_new_flags_are_one_line_errors(tmp_path, flag):
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "p", "verify": "true"}])
    done = run_cli(args_for(data, tmp_path / "out", "v", flag, "--api_key=k"), tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: --{flag[2:].split('=')[0]}")


def test_a_check_that_prints_any_value_gives_a_result_never_an_internal_error(tmp_path):
    # The agent can often steer a check's last line; a number no float holds must not cost the sample.
    huge = "printf '9%0400d\\n' 0"  # a 401-digit integer
    rows = [
        {"prompt": "huge passes", "verify": huge},
        {"prompt": "huge fails", "verify": f"{huge}; exit 1"},
        {"prompt": "huge reward", "verify": "printf '{\"reward\": 9%0400d}\\n' 0"},
        {"prompt": "near miss", "answer": "391"},
    ]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(default_script=[answer("Not 391, it is 392.")]) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v"), tmp_path, srv)
    assert_clean_exit(done)
    run = RunDir(tmp_path / "out" / "v")
    assert run.failed() == []
    got = {prompt: (r[0]["reward"], r[0]["passed"]) for prompt, r in by_prompt(run.trajectories()).items()}
    assert got == {
        "huge passes": (1.0, True),  # no usable reward: the exit status decides
        "huge fails": (0.0, False),
        "huge reward": (1.0, True),
        "near miss": (0.0, False),
    }


def test_rewards_near_the_largest_float_give_their_mean_in_statistics_json_and_the_card(tmp_path):
    # Summed as they are, two rewards of 1e308 make Infinity, which json writes as a bare `Infinity`: not JSON.
    rows = [
        {"prompt": "big one", "verify": """echo '{"reward": 1e308}'"""},
        {"prompt": "big two", "verify": """echo '{"reward": 1.5e308}'"""},
    ]
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(default_script=[answer("done")]) as srv:
        done = run_cli(args_for(data, tmp_path / "out", "v", "--export=parquet"), tmp_path, srv)
    assert_clean_exit(done)
    text = (tmp_path / "out" / "v" / "statistics.json").read_text()

    def refuse(name):
        raise AssertionError(f"statistics.json holds {name}, which is not JSON")

    outcomes = json.loads(text, parse_constant=refuse)["outcomes"]
    assert outcomes["mean_reward"] == 1.25e308
    card = (tmp_path / "out" / "v" / "export" / "parquet" / "README.md").read_text()
    assert f"- reward: mean {1.25e308:.4f} over 2 trajectories" in card  # the export's card sums them alike
