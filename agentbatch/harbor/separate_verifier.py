"""A verifier the agent never touched: `[verifier] environment_mode = "separate"` (Harbor's _run_separate_verifier).

Once the agent's environment is stopped, the tests run in a fresh container with the verifier's own environment
([verifier.environment], else a copy of [environment]): its limits, variables, working directory and network
policy, on a network of its own (never the agent's). Its image is, as in Harbor, [verifier.environment]
docker_image (tests/ then uploaded into its working directory, /tests/test.sh in the image), else the image
built from tests/ (its Dockerfile puts /tests/test.sh there); a task that gives neither gets the task's own image
with tests/ copied to /tests. It receives the collected artifacts, each at its source path, and nothing else of
the agent's container: a file the agent planted elsewhere is not there. It is removed after the tests, whatever
happened.
"""

from __future__ import annotations

import os

from agentbatch.harbor import artifacts, container, network_policy, verifier
from agentbatch.harbor.task_dir import HarborTask
from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import Resources, SandboxError, SandboxSpec
from agentbatch.verification import CheckResult


def image_of(task: HarborTask, built: str | None, agents: str | None) -> tuple[str | None, str | None]:
    """The verifier's image and where tests/ goes in it: /tests (the task's own image), its working directory
    (a docker_image: Harbor's upload), or nowhere (an image built from tests/, which holds them)."""
    if task.verifier_image:
        return task.verifier_image, ""
    if task.verifier_build is not None:
        return built, None
    return agents, verifier.TESTS_DIR


def ensure_image(task: HarborTask, sample: SandboxSpec) -> None:
    """A prebuilt verifier image is here (pulled if not) before the agent's first model call: SandboxError if not."""
    if task.verifier_image:
        registry.get("docker").prepare(spec_of(task, sample, task.verifier_image))


def spec_of(task: HarborTask, sample: SandboxSpec, image: str) -> SandboxSpec:
    """The verifier container's spec: like the sample's (the run's settings and labels), its own environment."""
    own = task.config.verifier_config
    network, egress = network_policy.verifier_container(task.config)
    cpus = min(own.cpus, float(os.cpu_count() or 1)) if own.cpus else None
    resources = Resources(
        cpus=cpus,
        memory_mb=own.memory_mb,
        storage_mb=own.storage_mb,
        network=network,
        env=tuple(own.env.items()),
        egress=egress,
        own_network=True,
    )
    return SandboxSpec(
        sample.settings, image, own.workdir, run_name=sample.run_name, labels=dict(sample.labels), resources=resources
    )


def run(
    task: HarborTask,
    timeout: float,
    collected: artifacts.Collected,
    notes: str,
    sample: SandboxSpec,
    oracle: bool,
    built: str | None = None,
) -> CheckResult:
    """The tests in a container of their own (module docstring); SandboxError if it cannot be made."""
    image, tests_to = image_of(task, built, sample.image)
    if not image:
        raise SandboxError("the separate verifier's image was not made")
    spec = spec_of(task, sample, image)
    backend = registry.get("docker")
    backend.prepare(spec)  # a docker_image not here is pulled
    box = backend.create(spec)
    try:
        before = container.probe(box)
        artifacts.restore(box, task.config.artifacts, collected)
        if tests_to == "":
            tests_to = box.workdir if os.listdir(task.file("tests")) else None
        _, _, baseline, tests_phase = task.config.policies()
        network_policy.switch(box, baseline, tests_phase)
        return verifier.tests(box, task, timeout, before, notes, oracle, copy=tests_to)
    finally:
        backend.cleanup(box, False)
