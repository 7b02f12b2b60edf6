"""A verifier the agent never touched ([verifier] environment_mode = "separate"), the task's users and its artifacts,
through the real CLI and real Docker (docs/harbor.md, "A separate verifier"): a file the agent planted is seen by
a shared verifier and not by a separate one, which gets the collected artifacts alone; its image is the task's
own, or built from tests/ as Harbor builds it, with the verifier's own variables and limits; the agent's commands run as [agent] user and the tests as
[verifier] user; the artifacts are kept per sample in the run directory and shown in the report, with samples,
pass@k, resume and exports as for any task."""

from __future__ import annotations

import json
import shutil

import docker
import pytest
from cli_helpers import RunDir
from harbor_helpers import BUSYBOX, by_task, harbor_run, labelled, nothing_left, write_task

pytestmark = pytest.mark.docker

SOLVE = """echo planted > /tmp/agent-only.txt
echo separate > /logs/artifacts/mode.txt
id -u > /logs/artifacts/agent-uid
echo declared > /work/declared.txt
"""
# Harbor's examples/tasks/verifier-mode-matrix check: the agent's ambient files must not reach the verifier.
TEST = """if [ -e /tmp/agent-only.txt ]; then echo "ambient agent file leaked"; echo 0 > /logs/verifier/reward.txt; exit 0; fi
ok=1
[ "$(cat /logs/artifacts/mode.txt)" = separate ] || { echo "no mode.txt"; ok=0; }
[ "$(cat /work/declared.txt)" = declared ] || { echo "no declared.txt"; ok=0; }
[ "$(cat /logs/artifacts/agent-uid)" = 65534 ] || { echo "the agent was not nobody"; ok=0; }
[ "$(id -u)" = 0 ] || { echo "the tests are not root"; ok=0; }
[ "${VERIFIER_OWN:-shared}" = "${EXPECT_OWN:-shared}" ] || { echo "not the verifier's own environment"; ok=0; }
memory=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)
[ -z "$EXPECT_MEMORY" ] || [ "$memory" = "$EXPECT_MEMORY" ] || { echo "not the verifier's own limits: $memory"; ok=0; }
echo $ok > /logs/verifier/reward.txt
"""
USERS = '[agent]\nuser = "nobody"\n[verifier]\nuser = "root"\n'
ENV = '[environment]\nworkdir = "/work"\n'
TOP = 'artifacts = ["/work/declared.txt"]\n'


def test_only_a_separate_verifier_misses_the_planted_file_and_gets_the_artifacts(
    tmp_path, docker_images, docker_run_name
):
    root = tmp_path / "tasks"
    write_task(root, "shared", TEST, SOLVE, toml=USERS + ENV, top=TOP)
    # No [verifier.environment] docker_image and no tests/Dockerfile: the task's own image, tests/ copied in; the
    # verifier's own variables, working directory and limits (256 MiB: the agent's container has none).
    own = (
        '[verifier.environment]\nenv = { VERIFIER_OWN = "yes", EXPECT_MEMORY = "268435456" }\nworkdir = "/work"\n'
        "memory_mb = 256\n"
    )
    write_task(
        root, "separate-own-image", TEST.replace("${EXPECT_OWN:-shared}", "yes"), SOLVE, toml=USERS + ENV + own, top=TOP
    )
    # Harbor's way: the verifier's image built from tests/ (its Dockerfile puts test.sh at /tests/test.sh).
    built = write_task(
        root,
        "separate-built",
        TEST,
        SOLVE,
        toml=USERS.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n') + ENV,
        top=TOP,
        files={"tests/Dockerfile": f"FROM {BUSYBOX}\nCOPY test.sh /tests/test.sh\nRUN mkdir -p /work\nWORKDIR /work\n"},
    )
    # Harbor's other way: [verifier.environment] docker_image, an image that holds /tests/test.sh; and one that
    # is nowhere, whose samples fail before the agent's first model call.
    verifier_image = f"br-test-verifier:{docker_run_name}"
    context = tmp_path / "verifier-image"
    context.mkdir()
    (context / "test.sh").write_text("#!/bin/sh\n" + TEST)
    (context / "Dockerfile").write_text(f"FROM {BUSYBOX}\nCOPY test.sh /tests/test.sh\n")
    engine = docker.from_env()
    engine.images.build(path=str(context), tag=verifier_image, rm=True)
    prebuilt = f'[verifier.environment]\ndocker_image = "{verifier_image}"\nworkdir = "/work"\n'
    write_task(root, "separate-prebuilt", "exit 3\n", SOLVE, toml=USERS + ENV + prebuilt, top=TOP)
    absent = '[verifier.environment]\ndocker_image = "br-test-absent:verifier"\n'
    write_task(root, "separate-absent", TEST, SOLVE, toml=ENV + absent, top=TOP)
    out = tmp_path / "out"
    flags = ("--model=oracle", "--samples_per_prompt=2", "--export=parquet,openai", "--report")

    try:
        done = harbor_run(root, out, docker_run_name, *flags)
    finally:
        engine.images.remove(verifier_image, force=True)

    assert done.returncode == 3, done.stderr  # separate-absent's samples failed, no token spent
    failed = RunDir(out / docker_run_name).failed()
    assert [r["task"]["name"] for r in failed] == ["separate-absent"] * 2
    assert all("'br-test-absent:verifier' is not here and could not be pulled" in r["error"] for r in failed)
    run_dir = out / docker_run_name
    run = RunDir(run_dir)
    lines = run.trajectories()
    rewards = sorted((r["task"]["name"], r["reward"]) for r in lines)
    assert rewards == [
        ("separate-built", 1.0),
        ("separate-built", 1.0),
        ("separate-own-image", 1.0),
        ("separate-own-image", 1.0),
        ("separate-prebuilt", 1.0),  # the image's test.sh ran, not the task's tests/test.sh (exit 3)
        ("separate-prebuilt", 1.0),
        ("shared", 0.0),
        ("shared", 0.0),
    ], [(r["task"]["name"], r["check"]["output"]) for r in lines]
    assert "ambient agent file leaked" in by_task(lines)["shared"]["check"]["output"]
    # Each sample's artifacts, in the run directory: /logs/artifacts and the declared file, with the manifest.
    for line in lines:
        folder = run_dir / "artifacts" / f"{line['prompt_index']}-{line['sample_index']}"
        assert (folder / "logs" / "artifacts" / "mode.txt").read_text() == "separate\n"
        assert (folder / "work" / "declared.txt").read_text() == "declared\n"
        manifest = json.loads((folder / "manifest.json").read_text())
        assert [(m["source"], m["status"]) for m in manifest] == [
            ("/logs/artifacts", "ok"),
            ("/work/declared.txt", "ok"),
        ]
    assert "declared.txt" in (run_dir / "report.html").read_text()
    o = run.stats()["outcomes"]
    assert (o["checked"], o["passed"], o["pass_at_k"]["2"]) == (8, 6, 0.75)
    assert len((run_dir / "export" / "openai" / "data.jsonl").read_text().splitlines()) == 8
    assert nothing_left(run_dir), labelled(run_dir)  # the verifiers' containers and networks too
    assert built.exists()

    shutil.rmtree(root / "separate-absent")
    again = harbor_run(root, out, docker_run_name, *flags, "--resume")
    assert again.returncode == 0, again.stderr
    assert len(RunDir(run_dir).trajectories()) == 8  # nothing ran again
