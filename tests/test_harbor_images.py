"""Harbor task images with the real Docker engine: built once and found by every later run, labelled with
the run that built them, cut at their build timeout, refused with the name of a FROM image that cannot be
had (docs/harbor.md, "Images"). Made as a session makes them before its first sample: each task's build
(`HarborTask.image_build`) given to the docker backend's `prepare_all` (sandboxes/docker_images.py)."""

from __future__ import annotations

import io
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import docker
import pytest

from agentbatch.harbor import task_dir
from agentbatch.sandboxes import docker_images, registry
from agentbatch.sandboxes.base import RUN_DIR_LABEL, Prepared, SandboxSpec

pytestmark = pytest.mark.docker

TASKS = Path(__file__).parent / "harbor_tasks"
BASE_SCRIPT = Path(__file__).parent / "build_debian_image.sh"


@pytest.fixture(scope="module")
def engine(docker_images):
    done = subprocess.run(["sh", str(BASE_SCRIPT)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    return docker.from_env()


def fresh_task(tmp_path: Path, dockerfile: str, build_timeout: float = 300.0) -> task_dir.HarborTask:
    """A copy of sum-numbers with this Dockerfile and a context of its own (so its own image tag)."""
    path = tmp_path / "task"
    shutil.copytree(TASKS / "sum-numbers", path)
    (path / "environment" / "Dockerfile").write_text(dockerfile)
    (path / "environment" / "unique.txt").write_text(f"{tmp_path}\n")
    toml = (path / "task.toml").read_text().replace("build_timeout_sec = 300.0", f"build_timeout_sec = {build_timeout}")
    (path / "task.toml").write_text(toml)
    return task_dir.load(str(path))


def ensure_images(tasks, run_dir: str, parallel: int, log, timeout: float | None = None) -> list[Prepared]:
    """The tasks' images as a session makes them: the docker backend's prepare_all over their builds (each within
    `timeout` if given), labelled with the run directory, its lines prefixed with the format's name."""
    builds = [t.image_build if timeout is None else replace(t.image_build, timeout=timeout) for t in tasks]
    specs = [SandboxSpec(build=b, labels={RUN_DIR_LABEL: run_dir}) for b in builds]
    return registry.get("docker").prepare_all(specs, parallel, lambda line: log(f"harbor: {line}"))


def test_an_image_is_built_once_labelled_with_its_run_and_found_after(tmp_path, engine):
    task = fresh_task(tmp_path, "FROM debian:bookworm-slim\nCOPY unique.txt /unique.txt\n")
    logged: list[str] = []
    first = ensure_images([task, task], "/runs/one", 2, logged.append)
    try:
        [again] = ensure_images([task], "/runs/two", 2, logged.append)
        labels = engine.images.get(first[0].image).labels
    finally:
        engine.images.remove(first[0].image, force=True)
    assert [(made.built, made.error) for made in first] == [(True, None)] * 2  # one image, built once for both
    assert (again.image, again.built, again.error) == (first[0].image, False, None)  # found, not built again
    assert labels == {task_dir.BUILT_LABEL: "task", RUN_DIR_LABEL: "/runs/one"}
    assert "harbor: building 1 image(s), 1 at a time" in logged
    assert any(line.startswith("harbor: task: Step 2/") for line in logged)
    assert sum("built (" in line for line in logged) == 1


def test_a_build_past_its_timeout_is_cut_and_leaves_nothing_running(tmp_path, engine):
    task = fresh_task(tmp_path, "FROM debian:bookworm-slim\nRUN echo started && sleep 120\n", build_timeout=3)
    start = time.monotonic()
    [result] = ensure_images([task], "/runs/slow", 1, lambda line: None)
    took = time.monotonic() - start
    assert result.error.startswith("image build failed: the build took over its build_timeout_sec (3 s)")
    assert "started" in result.error  # the log's tail
    assert took < 60, took  # not the 120 s the RUN wanted
    with pytest.raises(docker.errors.ImageNotFound):
        engine.images.get(result.image)
    deadline = time.monotonic() + 30  # the engine stops the build's container once its client is gone
    while engine.containers.list(filters={"ancestor": "debian:bookworm-slim", "status": "running"}):
        assert time.monotonic() < deadline, "the cut build's container still runs"
        time.sleep(0.5)


def test_a_from_image_that_cannot_be_had_is_named(tmp_path, engine):
    task = fresh_task(tmp_path, "FROM br-test-absent:nope AS base\nFROM base\n")
    [result] = ensure_images([task], "/runs/absent", 1, lambda line: None, timeout=60)
    assert result.error.startswith("FROM image 'br-test-absent:nope' is not on this machine and could not be pulled")
    assert result.error.endswith("it must be present (docker pull, load or import) or pullable")


def test_the_from_images_of_a_dockerfile():
    dockerfile = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11-slim\nARG EMPTY\n"
        "FROM ${BASE} AS build\nRUN make\n"
        "FROM --platform=linux/amd64 debian:12 \\\n  AS final\n"
        "COPY --from=build /out /out\n"
        "FROM build\nFROM scratch\nFROM $EMPTY\nFROM debian:12\n"
    )
    assert docker_images.base_images(dockerfile) == ["python:3.11-slim", "debian:12"]


def test_a_base_image_retagged_is_another_image(tmp_path, engine):
    """`FROM br-test-base:moving`: when that tag names another image, the task's image is built again from it."""
    engine.images.get("debian:bookworm-slim").tag("br-test-base", "moving")
    made = []
    try:
        task = fresh_task(tmp_path, "FROM br-test-base:moving\nCOPY unique.txt /unique.txt\n")
        [first] = ensure_images([task], "/runs/one", 1, lambda line: None)
        made.append(first.image)
        assert first.built and first.image_id == engine.images.get(first.image).id
        other, _ = engine.images.build(
            fileobj=io.BytesIO(b"FROM debian:bookworm-slim\nRUN echo moved > /moved\n"),
            tag="br-test-base:moving",
            rm=True,
            forcerm=True,
        )
        again = task_dir.load(task.path)  # as the next session loads it: the same files
        assert again.image == task_dir.load(task.path).image
        [second] = ensure_images([again], "/runs/two", 1, lambda line: None)
        made.append(second.image)
        assert second.image != first.image and second.built  # not the old image, silently
        assert second.base_ids == (other.id,)
        out = engine.containers.run(second.image, ["cat", "/moved", "/unique.txt"], remove=True)
        assert out.decode().startswith("moved\n")
        # Unchanged, it is found, not built again.
        third = task_dir.load(task.path)
        [found] = ensure_images([third], "/runs/three", 1, lambda line: None)
        assert (found.image, found.built) == (second.image, False)
    finally:
        for image in made:
            engine.images.remove(image, force=True)
        engine.images.remove("br-test-base:moving", force=True)


def test_a_big_task_set_says_what_it_checks_before_any_build(tmp_path, engine):
    tasks = []
    for n in range(docker_images.CHECKING_NOTE_BUILDS):
        path = tmp_path / f"t{n}"
        shutil.copytree(TASKS / "sum-numbers", path)
        (path / "environment" / "Dockerfile").write_text("FROM br-test-absent:nope\n")
        tasks.append(task_dir.load(str(path)))
    logged: list[str] = []
    results = ensure_images(tasks, "/runs/many", 2, logged.append)
    assert logged[0] == f"harbor: checking the images of {len(tasks)} task(s)"
    assert len({r.image for r in results}) == len(tasks)
    assert all(r.error.startswith("FROM image 'br-test-absent:nope' is not on this machine") for r in results)
