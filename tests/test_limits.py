"""Per-prompt limits through the real CLI: each ends exactly the prompts that pass it, with its reason, and
nothing of theirs keeps running."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
from cli_helpers import RunDir, assert_clean_exit, prompt_of_record, run_cli, thinking, write_dataset
from conftest_docker import leftover_containers
from fake_site import FakeSite, trickle_reply
from helpers import make_ctx
from scripted_server import ScriptedServer

from agentbatch.limits import PromptLimits, SampleLimits
from agentbatch.model.client import ModelSettings
from agentbatch.tools.settings import ToolSettings

ARGS = ["--batch_size=10", "--distribution=terminal_only", "--num_workers=2", "--concurrency=4", "--max_retries=1"]


def call(command: str, **extra) -> dict:
    return {"reasoning": "run it", "tool_calls": [{"name": "terminal", "arguments": {"command": command}}], **extra}


def run(tmp_path, script: dict, *flags: str, prompts: list[str] | None = None, code: int = 0, **server):
    prompts = prompts or list(script)
    write_dataset(tmp_path / "ds.jsonl", prompts)
    with ScriptedServer(script=script, **server) as srv:
        proc = run_cli(["--dataset_file=ds.jsonl", "--run_name=limits", *ARGS, *flags], tmp_path, srv)
        requests = srv.requests()
    assert_clean_exit(proc, code)
    return RunDir(tmp_path / "data" / "limits"), requests, proc


def by_prompt(run: RunDir) -> dict[str, dict]:
    return {prompt_of_record(r): r for r in run.trajectories()}


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line holds the marker (a /proc scan)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def assert_none_left(marker: str) -> None:
    deadline = time.monotonic() + 15  # generous: a loaded machine reaps slowly, but a survivor never goes
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not processes_with(marker), f"a command of a timed-out prompt is still running ({marker})"


def test_prompt_timeout_cuts_commands_and_model_calls_and_ends_only_those_prompts(tmp_path):
    marker = f"br-limit-{uuid.uuid4().hex[:8]}"
    script = {
        # 60 s of command (command_timeout 60) and a 60 s model reply: both are cut at the 3 s deadline.
        "slow command": [call(f"sleep 60; echo {marker}"), thinking("never")],
        "slow model": [call("echo quick"), thinking("late", latency=60)],
        # Two calls in one reply: the first outlives the deadline, the second is answered without running.
        "two calls": [
            {
                "reasoning": "both",
                "tool_calls": [
                    {"name": "terminal", "arguments": {"command": f"sleep 60; echo {marker}"}},
                    {"name": "terminal", "arguments": {"command": "echo second"}},
                ],
            },
            thinking("never"),
        ],
        "fast": [call("echo fast"), thinking("in time")],
    }
    run_dir, requests, _ = run(tmp_path, script, "--prompt_timeout=3", "--request_timeout=120")
    assert_none_left(marker)
    records = by_prompt(run_dir)
    assert set(records) == set(script), "a prompt that hit the time limit must still be a trajectory"
    for prompt in ("slow command", "slow model", "two calls"):
        assert records[prompt]["stop_reason"] == "time", prompt
        assert records[prompt]["partial"] is True and records[prompt]["completed"] is False
    assert records["fast"]["stop_reason"] == "answered" and records["fast"]["completed"] is True
    cut = [t for t in records["slow command"]["conversations"] if t["from"] == "tool"]
    assert len(cut) == 1 and "time limit cut the command" in cut[0]["value"]
    second = [t for t in records["two calls"]["conversations"] if t["from"] == "tool"][1]
    assert "not run" in second["value"] and "second" not in second["value"]
    # Had the minute-long reply not been cut, it would have answered ("late"): the prompt would say answered.
    assert records["slow model"]["api_calls"] == 2  # the cut call counts: it was made
    # "slow command" never asked the model again after its command was cut.
    assert sum(1 for b in requests if b["messages"][0]["content"] == "slow command") == 1
    stats = run_dir.stats()
    assert stats["stop_reasons"] == {"time": 3, "answered": 1}
    assert stats["partial"] == 3 and stats["prompts"]["done"] == 4


def test_every_timeout_a_tool_reads_from_its_context_is_cut_to_the_time_the_prompt_has_left():
    settings = ToolSettings(command_timeout=60, request_timeout=120, web_timeout=30, max_output_chars=7)
    ctx = make_ctx(settings)
    assert ctx.settings is settings  # no time limit: the settings as they are
    ctx.limits = SampleLimits(PromptLimits(seconds=5))
    cut = ctx.settings
    assert max(cut.command_timeout, cut.request_timeout, cut.web_timeout) <= 5
    assert min(cut.command_timeout, cut.request_timeout, cut.web_timeout) > 4
    assert cut.max_output_chars == 7 and cut.private_networks == settings.private_networks
    ctx.limits = SampleLimits(PromptLimits(seconds=5), start=time.monotonic() - 6)  # the time is up
    assert ctx.settings.command_timeout == ctx.settings.web_timeout == 0


def tool_call(name: str, **arguments) -> dict:
    return {"reasoning": "look", "tool_calls": [{"name": name, "arguments": arguments}]}


def test_prompt_timeout_cuts_web_tools(tmp_path):
    page = b"<html><body><p>" + b"x" * 400 + b"</p></body></html>"
    site = FakeSite(
        {
            "/trickle": trickle_reply(page, 0.5),  # 200 s of body, a byte every half second
            "/search": trickle_reply(json.dumps({"results": []}).encode() + b" " * 400, 0.5),
        }
    )
    script = {
        # Ten trickling pages: 5 at a time, each cut only at WEB_TIMEOUT (30 s) without the prompt's limit.
        "extract": [tool_call("web_extract", urls=[f"{site.url}/trickle?{i}" for i in range(10)]), thinking("x")],
        # Three attempts of 30 s each, and the pauses between them.
        "search": [tool_call("web_search", query="anything"), thinking("x")],
    }
    env = {"TAVILY_API_KEY": "tvly-limits-test", "TAVILY_BASE_URL": site.url}
    write_dataset(tmp_path / "ds.jsonl", list(script))
    args = ["--dataset_file=ds.jsonl", "--run_name=limits", *ARGS, "--distribution=minimal"]
    try:
        with ScriptedServer(script=script) as srv:
            started = time.monotonic()
            proc = run_cli([*args, "--allow_private_urls=true", "--prompt_timeout=4"], tmp_path, srv, env=env)
            took = time.monotonic() - started
    finally:
        site.close()
    assert_clean_exit(proc)
    records = by_prompt(RunDir(tmp_path / "data" / "limits"))
    assert {p: r["stop_reason"] for p, r in records.items()} == dict.fromkeys(script, "time")
    extract, search = (
        json.loads(next(t["value"] for t in records[p]["conversations"] if t["from"] == "tool")) for p in script
    )
    assert [("Timeout" in e["error"]) for e in extract["results"]] == [True] * 10, extract
    assert "tavily search failed" in search["error"], search
    # Either tool alone would take 60 s or more; generous for a loaded machine, far below that.
    assert took < 40, took


def test_token_and_cost_limits_stop_before_the_next_call(tmp_path):
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cost": 0.01}
    script = {
        "loops": [call("echo again", usage=usage)],  # would call a tool forever
        "answers": [thinking("at once", usage=usage)],
    }
    run_dir, requests, _ = run(tmp_path, script, "--max_tokens_per_prompt=40", "--max_turns=10")
    loops = by_prompt(run_dir)["loops"]
    # 15 tokens a call: after the third (45 >= 40) no further call is made.
    assert loops["stop_reason"] == "tokens" and loops["partial"] is True and loops["api_calls"] == 3
    assert loops["usage"]["total_tokens"] == 45
    assert by_prompt(run_dir)["answers"]["stop_reason"] == "answered"

    run_dir, _, _ = run(tmp_path / "cost", script, "--max_cost_per_prompt=0.025", "--max_turns=10")
    loops = by_prompt(run_dir)["loops"]
    assert loops["stop_reason"] == "cost" and loops["api_calls"] == 3
    assert loops["usage"]["cost"] == pytest.approx(0.03)
    assert run_dir.stats()["stop_reasons"] == {"cost": 1, "answered": 1}


def test_max_turns_still_wins_when_a_limit_is_reached_with_the_last_turn(tmp_path):
    script = {"loops": [call("echo again")]}  # 15 tokens a call
    run_dir, _, _ = run(tmp_path, script, "--max_tokens_per_prompt=30", "--max_turns=2")
    loops = by_prompt(run_dir)["loops"]
    assert loops["stop_reason"] == "max_turns" and loops["partial"] is False


def test_max_tokens_is_sent_with_every_call(tmp_path):
    script = {"asks": [call("echo hi"), thinking("done")]}
    _, requests, _ = run(tmp_path, script, "--max_tokens=321")
    assert len(requests) == 2 and all(b["max_tokens"] == 321 for b in requests)
    _, requests, _ = run(tmp_path / "unset", script)
    assert all("max_tokens" not in b for b in requests)


def test_a_failed_prompt_says_error_and_counts_under_stop_reasons(tmp_path):
    script = {"fails": [{"fault": "500", "fault_times": -1}], "works": [thinking("fine")]}
    run_dir, _, _ = run(tmp_path, script, "--max_retries=0", code=3)
    (failed,) = run_dir.failed()
    assert failed["stop_reason"] == "error" and failed["model"] and failed["toolsets_used"] == ["terminal", "file"]
    assert run_dir.stats()["stop_reasons"] == {"answered": 1, "error": 1}


def test_openrouter_is_asked_for_its_usage_accounting_and_others_are_not():
    def body(url: str) -> dict:
        return ModelSettings(model="m", base_url=url, api_key="k").extra_body()

    assert body("https://openrouter.ai/api/v1")["usage"] == {"include": True}
    assert "usage" not in body("https://api.openai.com/v1")
    assert "usage" not in body("http://127.0.0.1:8000/v1")


@pytest.mark.docker
def test_prompt_timeout_removes_the_container_and_its_command(tmp_path, docker_run_name, docker_images):
    script = {"sleeps in docker": [call("sleep 120"), thinking("never")]}
    write_dataset(tmp_path / "ds.jsonl", list(script))
    args = ["--dataset_file=ds.jsonl", f"--run_name={docker_run_name}", "--sandbox=docker", "--prompt_timeout=4"]
    args.append(f"--docker_image={docker_images[0]}")
    args += ["--batch_size=10", "--distribution=terminal_only", "--num_workers=1", "--require_reasoning=false"]
    with ScriptedServer(script=script) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc)
    (record,) = RunDir(tmp_path / "data" / docker_run_name).trajectories()
    assert record["stop_reason"] == "time"
    (result,) = [t for t in record["conversations"] if t["from"] == "tool"]
    assert "time limit cut the command" in result["value"]  # the two-minute sleep was cut, not awaited
    assert leftover_containers(docker_run_name) == []


class CreationWatch:
    """The engine's create and start events of a run's containers, streamed while it runs (`docker events`)."""

    def __init__(self, run_name: str):
        import docker

        self.stream = docker.from_env().events(filters={"label": f"batch_runner.run={run_name}"}, decode=True)
        self.created: dict[str, int] = {}
        self.started: dict[str, int] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for e in self.stream:
                if e.get("Type") == "container" and e.get("Action") in ("create", "start"):
                    (self.created if e["Action"] == "create" else self.started)[e["id"]] = e["timeNano"]
        except Exception:  # the stream is closed at the end
            pass

    def intervals(self, expected: int) -> list[tuple[int, int]]:
        """(create, start) in ns of each container, once `expected` have started (generous deadline)."""
        deadline = time.monotonic() + 30
        while len(self.started) < expected and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stream.close()
        return sorted((t, self.started[c]) for c, t in self.created.items() if c in self.started)


@pytest.mark.docker
def test_sandbox_starts_bounds_the_containers_being_created_at_once(tmp_path, docker_run_name, docker_images):
    script = {f"docker prompt {i}": [call("echo hi"), thinking("done")] for i in range(6)}
    write_dataset(tmp_path / "ds.jsonl", list(script))
    args = ["--dataset_file=ds.jsonl", f"--run_name={docker_run_name}", "--sandbox=docker", "--batch_size=10"]
    args += [f"--docker_image={docker_images[0]}", "--distribution=terminal_only", "--require_reasoning=false"]
    args += ["--num_workers=1", "--concurrency=6", "--sandbox_starts=1"]
    watch = CreationWatch(docker_run_name)
    with ScriptedServer(script=script) as srv:
        proc = run_cli(args, tmp_path, srv)
    assert_clean_exit(proc)
    assert len(RunDir(tmp_path / "data" / docker_run_name).trajectories()) == 6
    intervals = watch.intervals(6)
    assert len(intervals) == 6
    # One at a time: each container is started before the next one is created, though six prompts ran at once.
    for (_, started), (created, _) in zip(intervals, intervals[1:], strict=False):
        assert created >= started, "two containers were being created at once"
