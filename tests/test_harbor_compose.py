"""Harbor tasks of several containers (environment/docker-compose.yaml) through the real CLI, real Docker and the
real Compose v2 binary (docs/harbor.md, "Several containers"): a service the agent reaches by name from main,
depends_on and healthchecks waited for, a service that never becomes healthy failing only its sample, the other
services' collect hooks and artifacts, and nothing left labelled in the engine, even after a kill -9."""

from __future__ import annotations

import os
import signal
import time

import pytest
from cli_helpers import RunDir, start_cli
from harbor_helpers import BUSYBOX, WEB, by_task, harbor_run, labelled, nothing_left, write_task
from scripted_server import ScriptedServer
from verify_helpers import answer, sh

pytestmark = pytest.mark.docker


# main as Harbor's terminal-bench mapper writes it: Harbor's variables for its image, limits and TEST_DIR.
MAIN = {
    "image": "${MAIN_IMAGE_NAME}",
    "command": ["sh", "-c", "sleep infinity"],
    "environment": ["TEST_DIR=${TEST_DIR}"],
    "deploy": {"resources": {"limits": {"cpus": "${CPUS}", "memory": "${MEMORY}"}}},
    "depends_on": {"web": {"condition": "service_healthy"}},
}
WEB_TASK = {"services": {"main": MAIN, "web": WEB}}
FETCHES = (
    "wget -q -O /tmp/page http://web:8000/ && cp /tmp/page /logs/artifacts/page.txt && cat /tmp/page\n"
    "echo test_dir=$TEST_DIR\n"
)
CHECK_PAGE = 'grep -qx "hello from web" /logs/artifacts/page.txt && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'


def test_the_agent_reaches_a_healthy_service_by_name_and_a_sick_one_fails_only_its_sample(
    tmp_path, compose_binary, docker_run_name
):
    root = tmp_path / "tasks"
    collect = '[[verifier.collect]]\ncommand = "cp /www/index.html /www/copy.html"\nservice = "web"\n'
    # Harbor's [environment] healthcheck, run in main after the services are up, before the agent.
    collect += '[environment]\nhealthcheck = { command = "wget -q -O /dev/null http://web:8000/", interval_sec = 1 }\n'
    write_task(
        root,
        "web",
        CHECK_PAGE,
        FETCHES,
        toml=collect,
        top='artifacts = [{ source = "/www/copy.html", service = "web", destination = "web/copy.html" }]\n',
        compose=WEB_TASK,
    )
    sick = dict(WEB, healthcheck={**WEB["healthcheck"], "test": ["CMD", "false"], "retries": 2})
    write_task(
        root,
        "sick",
        "echo 1 > /logs/verifier/reward.txt\n",
        toml="[environment]\nbuild_timeout_sec = 60\n",
        compose={"services": {"main": {"depends_on": {"web": {"condition": "service_healthy"}}}, "web": sick}},
    )
    unready = '[environment]\nhealthcheck = { command = "test -f /ready", interval_sec = 0.1, retries = 2 }\n'
    write_task(root, "unready", "echo 1 > /logs/verifier/reward.txt\n", toml=unready)
    out = tmp_path / "out"

    done = harbor_run(root, out, docker_run_name, "--model=oracle", "--samples_per_prompt=2", "--report")

    assert done.returncode == 3, done.stderr  # the sick task's samples failed; nothing else did
    run = RunDir(out / docker_run_name)
    web = [r for r in run.trajectories() if r["task"]["name"] == "web"]
    assert [(r["passed"], r["reward"]) for r in web] == [(True, 1.0), (True, 1.0)]
    ran = next(t["value"] for t in web[0]["conversations"] if t["from"] == "tool")
    assert "hello from web" in ran and "test_dir=/tests" in ran  # main reached the web service by its name
    failed = run.failed()
    assert sorted(r["task"]["name"] for r in failed) == ["sick", "sick", "unready", "unready"]
    sick = [r["error"] for r in failed if r["task"]["name"] == "sick"]
    assert all("the task's services did not start" in e and "unhealthy" in e for e in sick)
    unready = [r["error"] for r in failed if r["task"]["name"] == "unready"]
    assert unready == ["the task's healthcheck failed 2 time(s) in a row: 'test -f /ready' (exit 1)"] * 2
    assert all(r["usage"]["total_tokens"] == 0 for r in failed)
    # The artifacts of each sample, main's and the web service's (after its collect hook), in the run directory.
    index = web[0]["prompt_index"]
    folder = out / docker_run_name / "artifacts" / f"{index}-{web[0]['sample_index']}"
    assert (folder / "logs" / "artifacts" / "page.txt").read_text() == "hello from web\n"
    assert (folder / "web" / "copy.html").read_text() == "hello from web\n"
    assert '"status": "ok"' in (folder / "manifest.json").read_text()
    report = (out / docker_run_name / "report.html").read_text()
    assert "web/copy.html" in report and "Artifacts" in report
    assert nothing_left(out / docker_run_name), labelled(out / docker_run_name)
    o = run.stats()["outcomes"]  # pass@k over the samples that ran, as for any task
    assert (o["checked"], o["passed"], o["pass_at_k"]["2"]) == (2, 2, 1.0)


def start_sleeping_sample(root, out, run_name, srv, tmp_path):
    """A runner whose one sample sleeps in its Compose project, once the project's two containers are up."""
    args = [f"--dataset_file={root}", "--batch_size=1", f"--run_name={run_name}", f"--output_dir={out}"]
    runner = start_cli([*args, "--require_reasoning=false", "--max_retries=0"], tmp_path, server=srv)
    deadline = time.monotonic() + 120
    while len(labelled(out / run_name)["containers"]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    left = labelled(out / run_name)
    assert len(left["containers"]) == 2 and left["networks"], left  # main and web, on the sample's network
    return runner


def test_a_killed_runner_leaves_a_project_that_the_next_session_removes(tmp_path, compose_binary, docker_run_name):
    root = tmp_path / "tasks"
    write_task(root, "web", CHECK_PAGE, FETCHES, compose=WEB_TASK)
    out = tmp_path / "out"
    run_dir = out / docker_run_name
    script = {(root / "web" / "instruction.md").read_text(): [sh("sleep 600"), answer("done")]}
    with ScriptedServer(script=script) as srv:
        runner = start_sleeping_sample(root, out, docker_run_name, srv, tmp_path)
        os.killpg(runner.pid, signal.SIGKILL)  # the runner and its workers, at once
        runner.wait(30)
        assert labelled(run_dir)["containers"], "the project should outlive a killed runner"

        again = harbor_run(root, out, docker_run_name, "--resume", "--model=oracle")

    assert again.returncode == 0, again.stderr
    assert "removed 2 containers left by an earlier session" in again.stderr
    assert nothing_left(run_dir), labelled(run_dir)
    assert [r["passed"] for r in RunDir(run_dir).trajectories()] == [True]


def test_ctrl_c_twice_removes_the_project_of_the_sample_it_stops(tmp_path, compose_binary, docker_run_name):
    root = tmp_path / "tasks"
    write_task(root, "web", CHECK_PAGE, FETCHES, compose=WEB_TASK)
    out = tmp_path / "out"
    script = {(root / "web" / "instruction.md").read_text(): [sh("sleep 600"), answer("done")]}
    with ScriptedServer(script=script) as srv:
        runner = start_sleeping_sample(root, out, docker_run_name, srv, tmp_path)
        os.killpg(runner.pid, signal.SIGINT)  # as a terminal sends it: the runner's to handle, not Compose's
        time.sleep(1)
        os.killpg(runner.pid, signal.SIGINT)  # the second: quit at once
        _, err = runner.communicate(timeout=120)

    assert runner.returncode == 130, err
    assert "interrupted at once" in err
    assert nothing_left(out / docker_run_name), labelled(out / docker_run_name)


def test_a_compose_file_that_reaches_beyond_the_sample_is_refused_at_load(tmp_path, compose_binary):
    root = tmp_path / "tasks"
    for name, service in {
        "privileged": {"image": BUSYBOX, "privileged": True},
        "host-network": {"image": BUSYBOX, "network_mode": "host"},
        "bind": {"image": BUSYBOX, "volumes": ["/etc:/host-etc"]},
        "named": {"image": BUSYBOX, "container_name": "fixed"},
    }.items():
        write_task(root, name, "true\n", compose={"services": {"main": {}, "side": service}})
    write_task(root, "host-variable", "true\n", compose={"services": {"main": {"environment": ["X=${HOST_SECRET}"]}}})
    out = tmp_path / "out"

    done = harbor_run(root, out, "refused", "--model=oracle")

    assert done.returncode == 2, done.stderr  # no runnable task
    err = done.stderr
    assert "privileged: skipped: environment/docker-compose.yaml: service 'side' is privileged" in err
    assert "host-network: skipped: environment/docker-compose.yaml: service 'side' has network_mode 'host'" in err
    assert "bind: skipped: environment/docker-compose.yaml: service 'side' bind-mounts /etc" in err
    assert "named: skipped: environment/docker-compose.yaml: service 'side' sets container_name" in err
    assert "host-variable: skipped: environment/docker-compose.yaml: it uses ${HOST_SECRET}, which is not set" in err


def test_a_compose_tasks_lines_carry_main_image_and_export(tmp_path, compose_binary, docker_run_name):
    root = tmp_path / "tasks"
    write_task(root, "web", CHECK_PAGE, FETCHES, compose=WEB_TASK)
    out = tmp_path / "out"
    done = harbor_run(root, out, docker_run_name, "--model=oracle", "--export=parquet")
    assert done.returncode == 0, done.stderr
    line = by_task(RunDir(out / docker_run_name).trajectories())["web"]
    assert line["task"]["image"] == BUSYBOX and line["passed"]
    assert list((out / docker_run_name / "export" / "parquet").rglob("*.parquet"))


def test_a_budget_stops_compose_tasks_and_a_resume_runs_each_left_once(tmp_path, compose_binary, docker_run_name):
    """--budget_tokens on tasks of several containers: the budget holds as on any task (no sample starts past it,
    the projects of those that ran are removed), and --resume runs each task left exactly once."""
    root = tmp_path / "tasks"
    for name in ("web-a", "web-b", "web-c"):
        write_task(root, name, CHECK_PAGE, FETCHES, compose=WEB_TASK)
    out = tmp_path / "out"
    run_dir = out / docker_run_name
    flags = ("--require_reasoning=false", "--concurrency=1", "--max_retries=0")
    with ScriptedServer(default_script=[answer("done")]) as srv:
        stopped = harbor_run(root, out, docker_run_name, *flags, "--budget_tokens=20", server=srv)
        first = len(srv.requests())
        again = harbor_run(root, out, docker_run_name, *flags, "--resume", "--budget_tokens=100000", server=srv)
        prompts = [r["messages"][-1]["content"] for r in srv.requests()]

    assert stopped.returncode == 4, stopped.stderr
    assert again.returncode == 0, again.stderr
    assert 1 <= first < 3  # stopped before every task ran
    assert sorted(prompts) == sorted((root / n / "instruction.md").read_text() for n in ("web-a", "web-b", "web-c"))
    lines = RunDir(run_dir).trajectories()
    assert sorted(r["task"]["name"] for r in lines) == ["web-a", "web-b", "web-c"]  # each once
    assert nothing_left(run_dir), labelled(run_dir)
