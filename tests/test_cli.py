"""The real CLI in a subprocess: documented command lines, help, fatal errors, flags reaching the server, scheduling."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess

import pytest
from cli_helpers import (
    RunDir,
    assert_clean_exit,
    cli_env,
    first_turn_prompts,
    prompt_of_record,
    run_cli,
    thinking,
    write_dataset,
)
from scripted_server import ScriptedServer

from toolset_distributions import DISTRIBUTIONS

# The README's command lines, verbatim.
DOCUMENTED = [
    """python batch_runner.py --dataset_file=data/prompts.jsonl --batch_size=10 --run_name=my_first_run \\
        --model=anthropic/claude-sonnet-4.6 --num_workers=4""",
    "python batch_runner.py --dataset_file=data/prompts.jsonl --batch_size=10 --run_name=my_first_run --resume",
    "python batch_runner.py --list_distributions",
]
DOCUMENTED_FLAGS = (
    "dataset_file batch_size run_name distribution model base_url api_key max_turns num_workers resume verbose "
    "max_samples providers_allowed providers_ignored providers_order provider_sort reasoning_effort "
    "reasoning_disabled ephemeral_system_prompt log_prefix_chars prefill_messages_file list_distributions "
    "require_reasoning seed sandbox"
).split()


def documented_args(line: str) -> list[str]:
    words = shlex.split(line.replace("\\\n", " "))
    assert words[:2] == ["python", "batch_runner.py"]
    return words[2:]


@pytest.fixture(scope="module")
def server():
    with ScriptedServer(default_script=[thinking("answer to {prompt}")]) as srv:
        yield srv


@pytest.mark.slow
def test_documented_command_lines_work_verbatim(tmp_path, server):
    prompts = [f"documented prompt {i}" for i in range(5)]
    write_dataset(tmp_path / "data" / "prompts.jsonl", prompts)

    first = run_cli(documented_args(DOCUMENTED[0]), tmp_path, server)
    assert_clean_exit(first)
    run = RunDir(tmp_path / "data" / "my_first_run")
    records = run.trajectories()
    assert sorted(prompt_of_record(r) for r in records) == prompts
    assert {r["metadata"]["model"] for r in records} == {"anthropic/claude-sonnet-4.6"}
    assert {b["model"] for b in server.requests()} == {"anthropic/claude-sonnet-4.6"}
    assert run.batch_numbers() == [0]
    assert "done 5" in first.stdout

    asked = len(server.requests())
    again = run_cli(documented_args(DOCUMENTED[1]), tmp_path, server)
    assert_clean_exit(again)
    assert len(server.requests()) == asked, "a finished run resumed must ask the model nothing"
    assert "5 already done, 0 to run" in again.stderr
    assert sorted(prompt_of_record(r) for r in run.trajectories()) == prompts

    # The first line again, without --resume, must refuse to mix into the existing run.
    clash = run_cli(documented_args(DOCUMENTED[0]), tmp_path, server)
    assert clash.returncode != 0
    assert_one_error_line(clash, "--resume")


def parse_listing(text: str) -> list[tuple[str, str, list[tuple[str, int]]]]:
    """(name, description, [(toolset, percent), ...]) per distribution of the --list_distributions text."""
    lines = [line for line in text.splitlines() if line.strip()]
    out = []
    for head, body in zip(lines[::2], lines[1::2], strict=True):
        name, _, description = head.partition(": ")
        pairs = [re.fullmatch(r"(\w+) (\d+)%", p.strip()) for p in body.split(",")]
        assert all(pairs), body
        out.append((name, description, [(m.group(1), int(m.group(2))) for m in pairs]))
    return out


def check_listing(text: str) -> None:
    listing = parse_listing(text)
    assert [name for name, _, _ in listing] == list(DISTRIBUTIONS)
    for name, description, toolsets in listing:
        assert description == DISTRIBUTIONS[name].description and description.strip()
        assert dict(toolsets) == DISTRIBUTIONS[name].probabilities
        percents = [p for _, p in toolsets]
        assert percents == sorted(percents, reverse=True), f"{name}: not highest first"


def test_list_distributions_prints_every_distribution_highest_first(tmp_path):
    proc = run_cli(documented_args(DOCUMENTED[2]), tmp_path)
    assert_clean_exit(proc)
    assert len(DISTRIBUTIONS) == 17
    check_listing(proc.stdout)
    assert "mixed_tasks" in proc.stdout and "terminal 92%, file 92%, browser 92%, web 35%" in proc.stdout


def test_help_names_every_flag(tmp_path):
    proc = run_cli(["--help"], tmp_path)
    assert_clean_exit(proc)
    for flag in DOCUMENTED_FLAGS:
        assert f"--{flag}" in proc.stdout, f"--help does not mention --{flag}"
    assert not list(tmp_path.iterdir()), "--help must not start a run"


def test_console_script_takes_the_same_flags(tmp_path):
    exe = shutil.which("batch-runner")
    if exe is None:
        pytest.skip("console script batch-runner is not on PATH (pip install -e . installs it)")
    listed = subprocess.run([exe, "--list_distributions"], env=cli_env(), capture_output=True, text=True, timeout=60)
    assert_clean_exit(listed)
    check_listing(listed.stdout)
    helped = subprocess.run([exe, "--help"], env=cli_env(), capture_output=True, text=True, timeout=60)
    assert_clean_exit(helped)
    assert all(f"--{flag}" in helped.stdout for flag in DOCUMENTED_FLAGS)
    bad = subprocess.run(
        [exe, "--dataset_file=none.jsonl", "--batch_size=0", "--run_name=r"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode != 0
    assert_one_error_line(bad, "batch_size")


def assert_one_error_line(proc, *words: str) -> None:
    """Exactly one line on stderr, naming the problem, and no traceback."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), lines[0]
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    assert "Traceback" not in proc.stderr + proc.stdout


FATAL_CASES = {
    "missing dataset": (["--dataset_file=missing.jsonl"], ["missing.jsonl", "does not exist"]),
    "no valid entries": (["--dataset_file=blank.jsonl"], ["no valid entries", "blank.jsonl"]),
    "unknown distribution": (["--distribution=nonesuch"], ["nonesuch", "--list_distributions"]),
    "zero batch size": (["--batch_size=0"], ["--batch_size"]),
    "non-numeric workers": (["--num_workers=abc"], ["--num_workers", "abc"]),
    "unknown effort": (["--reasoning_effort=huge"], ["--reasoning_effort", "huge"]),
    "unknown sort": (["--provider_sort=x"], ["--provider_sort", "price"]),
    "missing prefill": (["--prefill_messages_file=nofile.json"], ["nofile.json"]),
    "unreadable prefill": (["--prefill_messages_file=adir"], ["cannot read prefill file", "adir"]),
    "invalid prefill": (["--prefill_messages_file=broken.json"], ["broken.json", "not valid JSON"]),
    "prefill not a list": (["--prefill_messages_file=object.json"], ["object.json", "array"]),
    "unknown flag": (["--bogus_flag=1"], ["--bogus_flag"]),
    "bad sandbox": (["--sandbox=vm"], ["--sandbox", "vm"]),
}


@pytest.mark.parametrize("case", list(FATAL_CASES))
def test_fatal_problems_print_one_line_and_exit_nonzero(tmp_path, server, case):
    extra, words = FATAL_CASES[case]
    prompt = f"fine prompt for {case}"
    write_dataset(tmp_path / "ok.jsonl", [prompt])
    (tmp_path / "blank.jsonl").write_text("\n  \n\r\n", encoding="utf-8")
    (tmp_path / "adir").mkdir()
    (tmp_path / "broken.json").write_text('[{"role": "user", ', encoding="utf-8")
    (tmp_path / "object.json").write_text('{"role": "user", "content": "x"}', encoding="utf-8")
    base = ["--dataset_file=ok.jsonl", "--batch_size=1", "--run_name=fatal", "--num_workers=1"]
    proc = run_cli(base + extra, tmp_path, server, timeout=60)
    assert proc.returncode != 0, proc.stderr
    assert_one_error_line(proc, *words)
    assert prompt not in first_turn_prompts(server), "a fatal problem must be found before any model call"
    assert not (tmp_path / "data" / "fatal").exists()


def test_dataset_of_only_bad_lines_warns_by_line_then_fails(tmp_path, server):
    (tmp_path / "bad.jsonl").write_text('not json\n\n["a list"]\n{"prompt": ""}\n', encoding="utf-8")
    proc = run_cli(["--dataset_file=bad.jsonl", "--batch_size=1", "--run_name=r"], tmp_path, server, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert [re.match(r"warning: bad\.jsonl:(\d+): skipped", line).group(1) for line in lines[:-1]] == ["1", "3", "4"]
    assert lines[-1].startswith("error: no valid entries")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_flags_reach_the_server_exactly_and_dataset_warnings_name_lines(tmp_path):
    lines = [
        json.dumps({"prompt": "first"}),
        "this is not json",
        "",
        json.dumps(["a", "list"]),
        json.dumps({"text": "no prompt key"}),
        json.dumps({"prompt": 5}),
        json.dumps({"prompt": "   "}),
        json.dumps({"prompt": "second, with a comma"}),
        json.dumps({"prompt": "third — ünïcode"}),
        json.dumps({"prompt": "fourth, beyond max_samples"}),
    ]
    # BOM and CRLF line ends must not move line numbers or break the first line.
    (tmp_path / "ds.jsonl").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    prefill = [{"role": "user", "content": "PREFILL-Q"}, {"role": "assistant", "content": "PREFILL-A"}]
    (tmp_path / "prefill.json").write_text(json.dumps(prefill), encoding="utf-8")
    args = [
        "--dataset_file=ds.jsonl",
        "--batch_size=2",
        "--run_name=flags",
        "--num_workers=1",
        "--max_samples=3",
        "--distribution=minimal",
        "--providers_allowed=alpha,beta",  # Fire turns this into a tuple
        '--providers_ignored="gamma,delta"',  # and this into a string
        "--providers_order=epsilon",
        "--provider_sort=price",
        "--reasoning_effort=high",
        "--ephemeral_system_prompt=Be brief, please",
        "--prefill_messages_file",
        "prefill.json",
        "--model",
        "vendor/model-1.5",
        "--output_dir=out",
    ]
    with ScriptedServer(default_script=[thinking("ok")]) as srv:
        proc = run_cli(args, tmp_path, srv)
        bodies = srv.requests()
    assert_clean_exit(proc)
    warned = sorted(int(m) for m in re.findall(r"ds\.jsonl:(\d+): skipped", proc.stderr))
    assert warned == [2, 4, 5, 6, 7]

    # The prefill's user turn comes first, so the prompt is the fourth message.
    asked = sorted(b["messages"][3]["content"] for b in bodies)
    assert asked == ["first", "second, with a comma", "third — ünïcode"]
    for body in bodies:
        assert body["model"] == "vendor/model-1.5"
        assert body["provider"] == {
            "only": ["alpha", "beta"],
            "ignore": ["gamma", "delta"],
            "order": ["epsilon"],
            "sort": "price",
        }
        assert body["reasoning"] == {"enabled": True, "effort": "high"}
        assert body["messages"][:3] == [{"role": "system", "content": "Be brief, please"}, *prefill]
        assert body["messages"][3]["role"] == "user"
        assert {t["function"]["name"] for t in body.get("tools", [])} <= {"web_search", "web_extract"}

    run = RunDir(tmp_path / "out" / "flags")
    written = "".join(p.read_text(encoding="utf-8") for p in run.path.glob("*.json*"))
    assert "Be brief" not in written and "PREFILL" not in written
    assert [r["toolsets_used"] for r in run.trajectories()] == [["web"]] * 3


@pytest.mark.slow
def test_one_slow_prompt_never_holds_up_the_others(tmp_path):
    fast = [f"fast {i}" for i in range(6)]
    write_dataset(tmp_path / "ds.jsonl", ["slow one", *fast])
    script = {"slow one": [thinking("late", latency=6)]}
    args = ["--dataset_file=ds.jsonl", "--batch_size=100", "--run_name=sched", "--num_workers=2"]
    with ScriptedServer(script=script, default_script=[thinking("quick", latency=0.3)]) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc)
    # One batch file: its lines are in the order the prompts finished.
    order = [prompt_of_record(r) for r in RunDir(tmp_path / "data" / "sched").batch_records()]
    assert sorted(order) == sorted(["slow one", *fast])
    assert order[-1] == "slow one", f"prompts waited for the slow one: {order}"


def test_each_line_says_how_long_its_sample_ran(tmp_path):
    script = {"slow": [thinking("slow answer", latency=1.2)], "quick": [thinking("quick answer")]}
    write_dataset(tmp_path / "d.jsonl", ["slow", "quick"])
    with ScriptedServer(script=script) as srv:
        done = run_cli(
            ["--dataset_file=d.jsonl", "--batch_size=2", "--run_name=timed", "--sandbox=local"], tmp_path, srv
        )
    assert_clean_exit(done)
    seconds = {prompt_of_record(r): r["duration_seconds"] for r in RunDir(tmp_path / "data" / "timed").trajectories()}
    assert 1.2 <= seconds["slow"] < 30 and 0 <= seconds["quick"] < seconds["slow"]
