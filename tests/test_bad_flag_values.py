"""Flag values that cannot work are one line and exit 2 before anything starts (issue 26, item 14).

Numbers are finite and within sane bounds, URLs parse with their ports, files named by flags are regular files
read with a size cap, keys can go into a header: each checked once, by the flag's declaration (flags.py,
flag_checks.py). Every case goes through the real CLI against a reachable endpoint, so a value that slipped
past its check would run (and fail the test) rather than hang.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cli_helpers import run_cli, write_dataset
from scripted_server import ScriptedServer

from agentbatch.flag_checks import MAX_FLAG_FILE_BYTES

SECRET = "s3cret-in-url"
TIMEOUT = 60
ENV = "env:"  # a case's item starting so is an environment variable, not a flag


def _cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """name -> (flags, a phrase the one-line error must contain)."""
    fifo = tmp / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    big = tmp / "big.json"
    with open(big, "wb") as f:
        f.truncate(MAX_FLAG_FILE_BYTES + 1)  # sparse: nothing written
    aliases = tmp / "laughs.yaml"  # 280 bytes of nested YAML aliases: 9**7 values once expanded, or shown
    aliases.write_text(f"x: {{web: {_laughs(6)}}}\n")
    digits = tmp / "digits.yaml"
    digits.write_text(f"x: {{web: {'1' * 5001}}}\n")
    deep = tmp / "deep.json"
    deep.write_text("[" * 100_000)
    cases = {
        # the red team's
        "base_url with an open IPv6 bracket": (["--base_url=http://[::1"], "--base_url"),
        "base_url with port 99999": (["--base_url=http://127.0.0.1:99999/v1"], "port"),
        "request_timeout 1e999": (["--request_timeout=1e999"], "--request_timeout"),
        "command_timeout 1e999": (["--command_timeout=1e999"], "--command_timeout"),
        "sandbox_memory 99999999999g": (["--sandbox_memory=99999999999g"], "--sandbox_memory"),
        "prefill from /dev/zero": (["--prefill_messages_file=/dev/zero"], "not a regular file"),
        # the same families
        "base_url with port 0": (["--base_url=http://127.0.0.1:0/v1"], "port"),
        "base_url with a port of letters": (["--base_url=http://127.0.0.1:http/v1"], "port"),
        "base_url with a space": (["--base_url=http://127.0.0.1 /v1"], "--base_url"),
        "base_url with a non-ASCII host": (["--base_url=http://b\u00fccher.example/v1"], "ASCII"),
        "base_url with credentials": ([f"--base_url=http://user:{SECRET}@127.0.0.1/v1"], "--api_key"),
        "base_url without a host": (["--base_url=http:///v1"], "no host"),
        "image_base_url with port 99999": (["--image_base_url=http://127.0.0.1:99999/v1"], "--image_base_url"),
        "ray_address with port 99999": (["--ray_address=ray://127.0.0.1:99999"], "--ray_address"),
        "ray_address host:port with port 0": (["--ray_address=127.0.0.1:0"], "--ray_address"),
        "check_timeout 1e999": (["--check_timeout=1e999"], "--check_timeout"),
        "prompt_timeout 1e999": (["--prompt_timeout=1e999"], "--prompt_timeout"),
        "progress_seconds 1e999": (["--progress_seconds=1e999"], "--progress_seconds"),
        "request_timeout of a year": (["--request_timeout=31536000"], "--request_timeout"),
        "max_retries of a million": (["--max_retries=1000000"], "--max_retries"),
        "max_tokens of 20 digits": (["--max_tokens=99999999999999999999"], "--max_tokens"),
        "samples_per_prompt of a billion": (["--samples_per_prompt=1000000000"], "--samples_per_prompt"),
        "sandbox_file_size 99999999999g": (["--sandbox_file_size=99999999999g"], "--sandbox_file_size"),
        "sandbox_memory in Arabic digits": (["--sandbox_memory=\u0661\u0662g"], "--sandbox_memory"),
        "docker_memory 99999999999g": (["--docker_memory=99999999999g"], "--docker_memory"),
        "docker_cpus 1e999": (["--docker_cpus=1e999"], "--docker_cpus"),
        "docker_pids of 20 digits": (["--docker_pids=99999999999999999999"], "--docker_pids"),
        "sandbox_processes of 20 digits": (["--sandbox_processes=99999999999999999999"], "--sandbox_processes"),
        "sandbox_cpu_seconds of 20 digits": (["--sandbox_cpu_seconds=99999999999999999999"], "--sandbox_cpu_seconds"),
        "price_input 1e999": (["--price_input=1e999"], "--price_input"),
        "budget_usd 1e999": (["--budget_usd=1e999", "--price_input=1", "--price_output=1"], "--budget_usd"),
        "max_cost_per_prompt 1e999": (["--max_cost_per_prompt=1e999"], "--max_cost_per_prompt"),
        "prefill from a FIFO": ([f"--prefill_messages_file={fifo}"], "not a regular file"),
        "prefill from a directory": ([f"--prefill_messages_file={tmp}"], "is a directory"),
        "prefill over the size cap": ([f"--prefill_messages_file={big}"], "over 16 MiB"),
        "dataset from /dev/zero": (["--dataset_file=/dev/zero"], "not a regular file"),
        "mcp_config from /dev/zero": (["--mcp_config=/dev/zero"], "not a regular file"),
        "mcp_config over the size cap": ([f"--mcp_config={big}"], "over 16 MiB"),
        "distributions_file from a FIFO": ([f"--distributions_file={fifo}"], "not a regular file"),
        "timeout_multiplier 1e999": (["--timeout_multiplier=1e999"], "--timeout_multiplier"),
        "dataset from a FIFO": ([f"--dataset_file={fifo}"], "not a regular file"),
        "local model from /dev/zero": (["--model=local", "--local_model_path=/dev/zero"], "not a regular file"),
        "api_key with a line break": (["--api_key=key\r\nX-Forged: 1"], "header"),
        "api_key with a non-ASCII letter": (["--api_key=k\u00e9y"], "header"),
        # issue 33 (items 18-20): checked before the first model call, quoted in a short excerpt
        "distributions_file of nested YAML aliases": ([f"--distributions_file={aliases}"], "YAML aliases"),
        "distributions_file with a percent of 5001 digits": ([f"--distributions_file={digits}"], "too many digits"),
        "distributions_file nested too deeply": ([f"--distributions_file={deep}"], "nested too deeply"),
        "max_turns of 5001 digits": ([f"--max_turns={'1' * 5001}"], "--max_turns"),
        "seed of 5001 digits": ([f"--seed={'9' * 5001}"], "--seed"),
        "docker_pids of 5001 digits, read by Fire": (
            ["--docker_pids=1", f"--docker_pids={'1' * 5001}"],
            "--docker_pids",
        ),
        "compare names no run": (["--compare=nosuchrun"], "nosuchrun: it does not exist"),
        "compare names no run, with the report": (
            ["--report", "--compare=r,nosuchrun"],
            "nosuchrun: it does not exist",
        ),
        "export_toolsets names no toolset": (["--export=openai", "--export_toolsets=file,nosuch"], "'nosuch'"),
    }
    # Numbers the tools read from the environment follow the same rules.
    for value in ("nan", "1e999"):
        cases[f"WEB_TIMEOUT={value}"] = ([f"{ENV}WEB_TIMEOUT={value}"], "WEB_TIMEOUT")
    return cases


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case once, a few at a time (each a separate CLI process)."""
    tmp = tmp_path_factory.mktemp("flags")
    cases = _cases(tmp)
    ok = write_dataset(tmp / "ok.jsonl", ["fine prompt"])
    base = [f"--dataset_file={ok}", "--batch_size=1", "--run_name=r", f"--output_dir={tmp / 'out'}", "--model=m"]
    srv = ScriptedServer()
    with srv, ThreadPoolExecutor(4) as pool:
        futures = {}
        for name, (flags, _) in cases.items():
            # A reachable endpoint; a flag of the case replaces the same flag of the base.
            env = dict(f.removeprefix(ENV).split("=", 1) for f in flags if f.startswith(ENV))
            flags = [f for f in flags if not f.startswith(ENV)]
            given = {f.split("=")[0] for f in flags}
            common = [*base, f"--base_url={srv.base_url}", "--api_key=k"]
            args = [f for f in common if f.split("=")[0] not in given] + flags
            futures[name] = pool.submit(_run, args, tmp, env)
        done = {name: f.result() for name, f in futures.items()}
        asked = srv.requests()
    return tmp, cases, done, asked


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """The CLI's run; one that outlives TIMEOUT (a FIFO read forever, /dev/zero read into memory) is killed."""
    try:
        return run_cli(args, cwd, None, TIMEOUT, env)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(args, None, e.stdout or "", f"still running after {TIMEOUT} s")


def _laughs(levels: int) -> str:
    """A YAML list of 9 values, each the one before it repeated 9 times through an alias, `levels` deep."""
    if levels == 0:
        return "&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    return f"&a{levels} [{_laughs(levels - 1)}, " + ", ".join([f"*a{levels - 1}"] * 8) + "]"


def _names() -> list[str]:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return sorted(_cases(Path(d)))


@pytest.mark.parametrize("case", _names())
def test_a_value_that_cannot_work_is_one_line_and_exit_2_before_anything_starts(runs, case):
    tmp, cases, done, asked = runs
    proc, phrase = done[case], cases[case][1]
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr}"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[:2000]
    assert phrase in lines[0], lines[0][:2000]
    assert len(lines[0]) < 400, f"an error quotes a short excerpt, not {len(lines[0])} characters"
    assert "Traceback" not in proc.stderr + proc.stdout
    assert SECRET not in proc.stderr + proc.stdout
    assert "X-Forged" not in proc.stderr + proc.stdout
    assert not (tmp / "out" / "r").exists(), "a bad flag must not leave a run directory behind"
    assert asked == [], "a bad flag must be found before any model call"


def test_the_largest_values_allowed_still_run(tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", ["fine prompt"])
    with ScriptedServer() as srv:
        proc = run_cli(
            [
                f"--dataset_file={data}",
                "--batch_size=1",
                "--run_name=r",
                "--model=m",
                "--require_reasoning=false",
                "--request_timeout=604800",
                "--command_timeout=604800",
                "--prompt_timeout=604800",
                "--sandbox_memory=16384g",
                "--max_retries=100",
                "--price_input=1000000",
            ],
            tmp_path,
            srv,
        )
    assert proc.returncode == 0, proc.stderr


def test_a_report_that_cannot_be_written_after_the_run_keeps_the_runs_exit_code(tmp_path):
    """What fails after the session (here report.html is a directory) is one line; the run's own exit code (3: a
    prompt failed) stands, where a bare exit 2 said the run had not started."""
    data = write_dataset(tmp_path / "d.jsonl", ["fine prompt", "broken prompt"])
    (tmp_path / "data" / "r" / "report.html").mkdir(parents=True)
    script = {"broken prompt": [{"fault": "400", "fault_times": -1}]}
    with ScriptedServer(script=script) as srv:
        args = [f"--dataset_file={data}", "--batch_size=1", "--run_name=r", "--model=m", "--require_reasoning=false"]
        proc = run_cli([*args, "--report"], tmp_path, srv)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "report.html" in errors[0] and "exit code 3" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_compared_run_that_is_not_there_stops_the_export_of_an_existing_run_before_it_is_written(tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", ["fine prompt"])
    with ScriptedServer() as srv:
        args = [f"--dataset_file={data}", "--batch_size=1", "--run_name=r", "--model=m", "--require_reasoning=false"]
        assert run_cli(args, tmp_path, srv).returncode == 0
    proc = run_cli(["--run_name=r", "--export=openai", "--compare=nosuchrun"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: no run in") and "nosuchrun" in proc.stderr
    assert not (tmp_path / "data" / "r" / "export").exists()
