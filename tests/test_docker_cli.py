"""Docker sandboxes end to end: the real CLI, the scripted server and the real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import docker
import pytest
from cli_helpers import RunDir, assert_clean_exit, cli_command, cli_env, first_turn_prompts, run_cli, write_dataset
from conftest_docker import RUN_LABEL, leftover_containers
from scripted_server import ScriptedServer

pytestmark = pytest.mark.docker
MISSING_IMAGE = "nonexistent-image-xyz:1"
KEY_MARKER = "sk-br-marker-0123456789abcdef"


@pytest.fixture(autouse=True)
def _no_leftover_containers(docker_run_name):
    """Every test ends with `docker ps -a` empty of its run's containers (docker_run_name asserts it)."""
    yield


def call(name: str, **arguments) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def sh(command: str) -> dict:
    return call("terminal", command=command)


def scripted(*turns: dict) -> list[dict]:
    """The given tool turns, then a final answer (reused if the model is asked again)."""
    return [*turns, {"content": "all done"}]


def base_args(run_name: str, dataset, tmp_path, *extra: str) -> list[str]:
    return [
        f"--dataset_file={dataset}",
        "--batch_size=10",
        f"--run_name={run_name}",
        f"--output_dir={tmp_path / 'out'}",
        "--distribution=terminal_only",
        "--require_reasoning=false",
        "--max_retries=0",
        "--num_workers=1",
        *extra,
    ]


def tool_results(record: dict) -> list[tuple[str, dict]]:
    """(tool name, parsed result) of every tool turn, in order."""
    return [(t["name"], json.loads(t["value"])) for t in record["conversations"] if t["from"] == "tool"]


def by_prompt(records: list[dict]) -> dict[str, dict]:
    return {next(t["value"] for t in r["conversations"] if t["from"] == "human"): r for r in records}


class ContainerWatch:
    """Polls the run's labelled containers while a run goes on: the peak count and each one's `docker inspect`."""

    def __init__(self, run_name: str):
        self.run_name, self.peak, self.seen = run_name, 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        client = docker.from_env()
        while not self._stop.is_set():
            # The low-level call lists without inspecting, so a container removed meanwhile does not raise.
            found = client.api.containers(all=True, filters={"label": f"{RUN_LABEL}={self.run_name}"})
            self.peak = max(self.peak, len(found))
            for c in found:
                try:
                    self.seen.setdefault(c["Id"], client.api.inspect_container(c["Id"]))
                except docker.errors.NotFound:
                    pass  # removed between list and inspect
            self._stop.wait(0.1)

    def __enter__(self) -> ContainerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def envs(self) -> list[list[str]]:
        return [info["Config"]["Env"] or [] for info in self.seen.values()]


def test_rows_run_in_their_own_image_and_cwd_under_the_local_default(tmp_path, docker_images, docker_run_name):
    one, two = docker_images
    probe = "cat /etc/br-image 2>&1; pwd"
    rows = [
        {"prompt": "in image one", "image": one, "cwd": "/work/one/deep"},
        {"prompt": "in image two", "docker_image": two},
        {"prompt": "in image two elsewhere", "docker_image": two, "cwd": "/tmp/two"},
        {"prompt": "no image stays local", "cwd": str(tmp_path)},
    ]
    dataset = write_dataset(tmp_path / "rows.jsonl", rows)
    with ScriptedServer(script={r["prompt"]: scripted(sh(probe)) for r in rows}) as server:
        proc = run_cli(base_args(docker_run_name, dataset, tmp_path, "--num_workers=2"), tmp_path, server)
    assert_clean_exit(proc)
    assert leftover_containers(docker_run_name) == [], "a finished run left containers"
    records = by_prompt(RunDir(tmp_path / "out" / docker_run_name).trajectories())
    assert len(records) == len(rows)

    def output(prompt: str) -> list[str]:
        [(name, result)] = tool_results(records[prompt])
        assert name == "terminal" and result["exit_code"] == 0 and not result["error"], result
        return result["output"].splitlines()

    assert output("in image one") == [one, "/work/one/deep"]
    assert output("in image two") == [two, "/srv/two"]  # the image's WORKDIR when the row names no cwd
    assert output("in image two elsewhere") == [two, "/tmp/two"]
    local = output("no image stays local")
    assert local[-1] == str(tmp_path) and "br-test-busybox" not in local[0]


@pytest.mark.parametrize("how", ["flag", "TERMINAL_ENV"])
def test_docker_default_puts_every_row_in_its_own_container(tmp_path, docker_images, docker_run_name, how):
    one, _ = docker_images
    prompts = [f"isolated prompt {i}" for i in range(6)]
    # file -> terminal and terminal -> file within a prompt; the sleep keeps prompts overlapping.
    script = {
        p: scripted(
            call("write_file", path=f"from-file-{i}.txt", content=f"written by {i}"),
            sh(f"sleep 1; cat from-file-{i}.txt; echo; cat /etc/br-image; echo from-term-{i} > term-{i}.txt; ls"),
            call("read_file", path=f"term-{i}.txt"),
        )
        for i, p in enumerate(prompts)
    }
    dataset = write_dataset(tmp_path / "rows.jsonl", prompts)
    extra = ["--num_workers=2", "--concurrency=4", f"--docker_image={one}"]
    env = None
    if how == "flag":
        extra.append("--sandbox=docker")
    else:
        env = {"TERMINAL_ENV": "docker"}
    with ScriptedServer(script=script) as server, ContainerWatch(docker_run_name) as watch:
        proc = run_cli(base_args(docker_run_name, dataset, tmp_path, *extra), tmp_path, server, env=env)
    assert_clean_exit(proc)
    assert leftover_containers(docker_run_name) == [], "a finished run left containers"
    assert watch.peak >= 2, "prompts never ran in parallel containers"
    assert len(watch.seen) == len(prompts), "each prompt gets its own container"
    records = by_prompt(RunDir(tmp_path / "out" / docker_run_name).trajectories())
    assert sorted(records) == sorted(prompts)
    for i, p in enumerate(prompts):
        (w, wrote), (t, term), (r, read) = tool_results(records[p])
        assert (w, t, r) == ("write_file", "terminal", "read_file")
        assert not wrote["error"] and not term["error"] and not read["error"], (wrote, term, read)
        lines = term["output"].splitlines()
        assert lines[:2] == [f"written by {i}", one], term["output"]
        assert sorted(lines[2:]) == [f"from-file-{i}.txt", f"term-{i}.txt"], "a prompt saw another's files"
        assert read["content"] == f"from-term-{i}\n"


@pytest.fixture
def missing_image_tag():
    """The name of an image that does not exist; whatever the test tags with it is removed afterwards."""
    client = docker.from_env()
    try:
        client.images.remove(MISSING_IMAGE)
    except docker.errors.ImageNotFound:
        pass
    yield MISSING_IMAGE
    try:
        client.images.remove(MISSING_IMAGE)
    except docker.errors.ImageNotFound:
        pass


def test_an_unavailable_image_fails_its_prompt_at_once_and_resume_retries_it(
    tmp_path, docker_images, docker_run_name, missing_image_tag
):
    one, _ = docker_images
    rows = [{"prompt": "needs a missing image", "docker_image": missing_image_tag}, {"prompt": "fine", "image": one}]
    script = {r["prompt"]: scripted(sh("cat /etc/br-image")) for r in rows}
    dataset = write_dataset(tmp_path / "rows.jsonl", rows)
    args = base_args(docker_run_name, dataset, tmp_path)
    run = RunDir(tmp_path / "out" / docker_run_name)
    with ScriptedServer(script=script) as server:
        start = time.monotonic()
        first = run_cli(args, tmp_path, server)
        took = time.monotonic() - start
        assert_clean_exit(first, 3)
        asked = first_turn_prompts(server)
        assert asked["needs a missing image"] == 0, "the model was called for a prompt whose image is missing"
        assert asked["fine"] == 1
        [failed] = run.failed()
        assert failed["prompt"] == "needs a missing image"
        assert missing_image_tag in failed["error"] and "pulled" in failed["error"], failed["error"]
        assert failed["usage"] == {
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "total_tokens": 0,
            "cost": 0.0,
            "cached_calls": 0,
        }
        assert took < 60, f"a missing image took {took:.0f} s to fail"
        assert [r["conversations"][0]["value"] for r in run.trajectories()] == ["fine"]
        assert run.stats()["prompts"]["failed"] == 1

        subprocess.run(["docker", "tag", one, missing_image_tag], check=True, capture_output=True)
        since = len(server.requests())
        again = run_cli([*args, "--resume"], tmp_path, server)
        assert_clean_exit(again)
        assert first_turn_prompts(server, since) == {"needs a missing image": 1}, "resume re-ran only the failed one"
    records = by_prompt(run.trajectories())
    assert sorted(records) == ["fine", "needs a missing image"]
    [(_, result)] = tool_results(records["needs a missing image"])
    assert result["output"].strip() == one  # the tag is an alias of image one
    assert run.stats()["prompts"] == {"total": 2, "done": 2, "discarded": 0, "failed": 0, "not_run": 0}


def test_a_command_outliving_command_timeout_is_killed_and_the_run_goes_on(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    script = {
        "slow command": scripted(sh("echo started; sleep 47; echo never"), sh("ps | grep -c '[s]leep 47'; echo alive")),
        "quick": scripted(sh("echo quick")),
    }
    dataset = write_dataset(tmp_path / "rows.jsonl", list(script))
    extra = ["--sandbox=docker", f"--docker_image={one}", "--command_timeout=2", "--num_workers=2"]
    start = time.monotonic()
    with ScriptedServer(script=script) as server:
        proc = run_cli(base_args(docker_run_name, dataset, tmp_path, *extra), tmp_path, server)
    assert_clean_exit(proc)
    assert time.monotonic() - start < 40, "the run waited for the command instead of killing it"
    records = by_prompt(RunDir(tmp_path / "out" / docker_run_name).trajectories())
    (_, killed), (_, after) = tool_results(records["slow command"])
    assert "timed out" in killed["error"] and killed["exit_code"] != 0, killed
    assert "started" in killed["output"] and "never" not in killed["output"]
    assert after["output"].split() == ["0", "alive"], "the timed-out command was left running"
    assert records["slow command"]["tool_stats"]["terminal"] == {"count": 2, "success": 1, "failure": 1}
    assert tool_results(records["quick"])[0][1]["output"] == "quick\n"


def container_ids(run_name: str) -> set[str]:
    """Ids of the run's labelled containers; the low-level list never inspects, so removals meanwhile are fine."""
    return {c["Id"] for c in docker.from_env().api.containers(all=True, filters={"label": f"{RUN_LABEL}={run_name}"})}


def test_containers_of_a_killed_run_are_reaped_by_the_next_start(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    prompts = [f"long prompt {i}" for i in range(3)]
    dataset = write_dataset(tmp_path / "rows.jsonl", prompts)
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}", "--num_workers=3")
    run = RunDir(tmp_path / "out" / docker_run_name)
    log = tmp_path / "killed-run.log"
    with ScriptedServer(script={p: scripted(sh("sleep 300")) for p in prompts}) as server, open(log, "w") as out:
        proc = subprocess.Popen(
            cli_command([*args, "--command_timeout=600", "--verbose"], server),
            cwd=tmp_path,
            env=cli_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the whole process group (workers too) is killed below
        )
        try:
            deadline = time.monotonic() + 90
            while len(container_ids(docker_run_name)) < len(prompts) or len(server.requests()) < len(prompts):
                assert proc.poll() is None, f"the run ended early:\n{log.read_text()}"
                assert time.monotonic() < deadline, "the prompts never all got a container"
                time.sleep(0.2)
            time.sleep(1)  # let the sleeps start inside the containers
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    left = container_ids(docker_run_name)
    assert len(left) == len(prompts), f"SIGKILL should leave every container behind: {left}\n{log.read_text()}"
    assert not run.failed() and not run.batch_records(), "a prompt ended before the kill"

    with ScriptedServer(script={p: scripted(sh("cat /etc/br-image")) for p in prompts}) as server:
        again = run_cli([*args, "--resume"], tmp_path, server)
    assert_clean_exit(again)
    assert f"removed {len(prompts)} containers" in again.stderr, again.stderr
    assert container_ids(docker_run_name) == set()
    records = by_prompt(run.trajectories())
    assert sorted(records) == prompts
    assert all(tool_results(r)[0][1]["output"].strip() == one for r in records.values())


def test_the_runner_environment_and_api_key_never_reach_a_container(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    prompt = "show me your environment"
    dataset = write_dataset(tmp_path / "rows.jsonl", [prompt])
    host_env = {"OPENAI_API_KEY": KEY_MARKER + "-env", "BR_HOST_ONLY_VARIABLE": "host-value-42"}
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}")
    with ScriptedServer(script={prompt: scripted(sh("env; sleep 2"))}) as server:
        cmd = [*args, f"--base_url={server.base_url}", f"--api_key={KEY_MARKER}"]
        with ContainerWatch(docker_run_name) as watch:
            proc = run_cli(cmd, tmp_path, env=host_env)
        assert_clean_exit(proc)
        assert server.requests()[0] and all(KEY_MARKER not in json.dumps(b) for b in server.requests())
    [env] = watch.envs()
    assert any(v.startswith("PATH=") for v in env), env
    for value in env:
        assert KEY_MARKER not in value and "host-value-42" not in value and "API_KEY" not in value, env
    [record] = RunDir(tmp_path / "out" / docker_run_name).trajectories()
    [(_, result)] = tool_results(record)
    assert "PATH=" in result["output"], result
    # Redaction would hide a leak in the files: what the command saw must not even hold the placeholder.
    for needle in (KEY_MARKER, "REDACTED", "API_KEY", "host-value-42"):
        assert needle not in result["output"], result["output"]
    run_dir = tmp_path / "out" / docker_run_name
    assert all(KEY_MARKER not in p.read_text() for p in run_dir.iterdir() if p.is_file())


def test_limit_flags_reach_every_container(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    dataset = write_dataset(tmp_path / "rows.jsonl", ["limited"])
    limits = ["--docker_memory=96m", "--docker_cpus=0.5", "--docker_pids=64"]
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}", *limits)
    with ScriptedServer(script={"limited": scripted(sh("sleep 1; echo ok"))}) as server:
        with ContainerWatch(docker_run_name) as watch:
            proc = run_cli(args, tmp_path, server)
    assert_clean_exit(proc)
    [info] = watch.seen.values()
    host = info["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (96 * 2**20, 5 * 10**8, 64)
    assert host["MemorySwap"] == host["Memory"], "swap beyond the memory limit"


@pytest.mark.parametrize(
    "flag, problem",
    [("--docker_memory=2", "docker_memory"), ("--docker_memory=lots", "docker_memory"), ("--sandbox=modal", "sandbox")],
)
def test_bad_sandbox_settings_stop_the_run_before_any_model_call(tmp_path, docker_images, flag, problem):
    one, _ = docker_images
    dataset = write_dataset(tmp_path / "rows.jsonl", ["never asked"])
    with ScriptedServer() as server:
        proc = run_cli(base_args("bad-limits", dataset, tmp_path, f"--docker_image={one}", flag), tmp_path, server)
        assert server.requests() == []
    assert proc.returncode == 2, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("error: ") and f"--{problem}" in line, line


def test_terminal_env_is_read_case_blind_and_named_when_wrong(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    dataset = write_dataset(tmp_path / "rows.jsonl", ["where am I"])
    wrong = run_cli(base_args("bad-env", dataset, tmp_path), tmp_path, env={"TERMINAL_ENV": "modal"})
    assert wrong.returncode == 2
    assert "TERMINAL_ENV" in wrong.stderr and "'modal'" in wrong.stderr, wrong.stderr
    args = base_args(docker_run_name, dataset, tmp_path, f"--docker_image={one}")
    with ScriptedServer(script={"where am I": scripted(sh("cat /etc/br-image"))}) as server:
        proc = run_cli(args, tmp_path, server, env={"TERMINAL_ENV": " Docker "})
    assert_clean_exit(proc)
    [record] = RunDir(tmp_path / "out" / docker_run_name).trajectories()
    assert tool_results(record)[0][1]["output"].strip() == one


def start_in_containers(run_name: str, prompts: list[str], args: list[str], server, log) -> subprocess.Popen:
    """Start the CLI in its own process group and wait until each prompt sleeps in its container."""
    proc = subprocess.Popen(
        cli_command([*args, "--command_timeout=600", "--verbose"], server),
        cwd=log.parent,
        env=cli_env(),
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 90
    while len(container_ids(run_name)) < len(prompts) or len(server.requests()) < len(prompts):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the prompts never all got a container:\n{log.read_text()}")
        time.sleep(0.2)
    time.sleep(1)  # let the sleeps start inside the containers
    return proc


def test_a_run_quit_with_two_ctrl_c_leaves_no_container(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    prompts = [f"interrupted prompt {i}" for i in range(2)]
    dataset = write_dataset(tmp_path / "rows.jsonl", prompts)
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}", "--num_workers=2")
    with ScriptedServer(script={p: scripted(sh("sleep 300")) for p in prompts}) as server:
        proc = start_in_containers(docker_run_name, prompts, args, server, tmp_path / "run.log")
        try:
            os.kill(proc.pid, signal.SIGINT)  # the runner only: workers ignore Ctrl-C, as in a terminal
            time.sleep(1)
            os.kill(proc.pid, signal.SIGINT)
            code = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, (tmp_path / "run.log").read_text()
    assert container_ids(docker_run_name) == set(), "quitting at once left the prompts' containers behind"


def test_no_container_outlives_a_run_whose_worker_died(tmp_path, docker_images, docker_run_name):
    psutil = pytest.importorskip("psutil")
    one, _ = docker_images
    prompts = ["prompt of a dying worker"]
    dataset = write_dataset(tmp_path / "rows.jsonl", prompts)
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}")
    with ScriptedServer(script={p: scripted(sh("sleep 300")) for p in prompts}) as server:
        proc = start_in_containers(docker_run_name, prompts, args, server, tmp_path / "run.log")
        try:
            workers = [p for p in psutil.Process(proc.pid).children() if p.name() == "br-worker"]
            assert len(workers) == 1, workers
            workers[0].kill()
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert code == 3, (tmp_path / "run.log").read_text()
    [failed] = RunDir(tmp_path / "out" / docker_run_name).failed()
    assert "worker process died" in failed["error"]
    assert container_ids(docker_run_name) == set(), "the dead worker's container outlived the run"


def test_a_container_the_engine_refuses_fails_the_prompt_not_its_tool_call(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    too_many = (os.cpu_count() or 1) * 64  # the engine refuses more CPUs than the host has
    dataset = write_dataset(tmp_path / "rows.jsonl", ["needs a container", "needs no tool"])
    args = base_args(docker_run_name, dataset, tmp_path, "--sandbox=docker", f"--docker_image={one}")
    script = {"needs a container": scripted(sh("echo hi")), "needs no tool": scripted()}
    with ScriptedServer(script=script) as server:
        proc = run_cli([*args, f"--docker_cpus={too_many}"], tmp_path, server)
        assert_clean_exit(proc, 3)
        run = RunDir(tmp_path / "out" / docker_run_name)
        [failed] = run.failed()
        assert failed["prompt"] == "needs a container" and "CPU" in failed["error"], failed
        assert failed["usage"]["total_tokens"] > 0  # the model was called before the first tool call
        assert [r["conversations"][0]["value"] for r in run.trajectories()] == ["needs no tool"]
        # A trajectory of environment errors is no training data; with sane limits resume re-runs the prompt.
        again = run_cli([*args, "--resume"], tmp_path, server)
    assert_clean_exit(again)
    records = by_prompt(run.trajectories())
    assert tool_results(records["needs a container"])[0][1]["output"] == "hi\n"
