"""Setup and checks in Docker sandboxes, through the real CLI and the real engine: in the prompt's own container,
killed at their timeout, blind to the runner's key, and recorded as "could not run" when the container is gone."""

from __future__ import annotations

import threading
import time
import uuid

import docker
import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from conftest_docker import RUN_LABEL, leftover_containers
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, by_prompt, sh

pytestmark = pytest.mark.docker


def test_setup_and_checks_run_in_the_prompts_own_container(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    secret = f"BRSECRET{uuid.uuid4().hex}"
    rows = [
        {"prompt": "solve", "setup": "echo 6 > n.txt", "verify": 'test "$(cat out.txt)" = 42 && cat /etc/br-image'},
        {"prompt": "hang", "verify": "echo started; sleep 300"},
        {"prompt": "key", "verify": "if env | grep -q 'BRSECRE[T]'; then echo FOUND; exit 1; fi; env | wc -l"},
    ]
    script = {"solve": [sh('expr "$(cat n.txt)" \\* 7 > out.txt'), answer("42")]}
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(script=script, default_script=[answer("ok")]) as srv:
        flags = ["--sandbox=docker", f"--docker_image={one}", "--check_timeout=3", "--samples_per_prompt=2"]
        args = args_for(
            data, tmp_path / "out", docker_run_name, *flags, f"--api_key={secret}", f"--base_url={srv.base_url}"
        )
        done = run_cli(args, tmp_path, env={"OPENROUTER_API_KEY": secret})
    assert_clean_exit(done)
    assert leftover_containers(docker_run_name) == []
    lines = by_prompt(RunDir(tmp_path / "out" / docker_run_name).trajectories())
    for r in lines["solve"]:  # the agent's file, from the setup's file, checked in the same container
        assert (r["passed"], r["reward"], r["check"]["output"]) == (True, 1.0, f"{one}\n")
    for r in lines["hang"]:
        assert (r["check"]["status"], r["check"]["output"], r["passed"]) == ("timeout", "started\n", None)
    for r in lines["key"]:
        assert r["passed"] is True and int(r["check"]["output"]) > 0  # the check saw an environment, not the key
    hits = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not hits
    o = RunDir(tmp_path / "out" / docker_run_name).stats()["outcomes"]
    assert (o["checked"], o["passed"], o["timeout"], o["pass_rate"]) == (6, 4, 2, 0.6667)


def test_a_check_whose_container_is_gone_is_recorded_as_could_not_run(tmp_path, docker_images, docker_run_name):
    one, _ = docker_images
    data = write_dataset(tmp_path / "ds.jsonl", [{"prompt": "vanishes", "verify": "true"}])
    # The answer comes 4 s after the command ran: time enough to remove the container under the prompt.
    script = {"vanishes": [sh("echo here"), answer("done") | {"latency": 4}]}
    removed = []

    with ScriptedServer(script=script) as srv:

        def remove_after_the_command() -> None:
            client = docker.from_env()
            deadline = time.monotonic() + 60
            while len(srv.requests()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            for c in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={docker_run_name}"}):
                c.remove(force=True)
                removed.append(c.id)

        remover = threading.Thread(target=remove_after_the_command)
        remover.start()
        args = args_for(data, tmp_path / "out", docker_run_name, "--sandbox=docker", f"--docker_image={one}")
        done = run_cli(args, tmp_path, srv)
        remover.join(timeout=60)
    assert_clean_exit(done)
    assert len(removed) == 1
    (r,) = RunDir(tmp_path / "out" / docker_run_name).trajectories()
    assert (r["check"]["status"], r["reward"], r["passed"]) == ("error", None, None)
    assert r["check"]["output"].startswith("the check could not run: ")
    o = RunDir(tmp_path / "out" / docker_run_name).stats()["outcomes"]
    assert (o["checked"], o["error"], o["pass_rate"]) == (1, 1, 0.0)  # no result is not a pass
    assert "1 could not run" in done.stdout
