"""A task whose environment/ holds docker-compose.yaml: its Compose project, as Harbor's docker environment makes it.

Harbor merges the task's file over a base of its own (`main` built from environment/ or from [environment]
docker_image) and gives Compose its variables: MAIN_IMAGE_NAME, CONTEXT_DIR, PREBUILT_IMAGE_NAME, CPUS,
MEMORY, TEST_DIR and the ENV_*_PATH of the log directories, plus the task's [environment] env; so does this
runner, and no variable of this machine besides (a file that uses one, HOST_*_PATH say, is refused). `main` runs
the task's image: [environment] docker_image, else the image built from environment/Dockerfile, else what the
file gives main (its `image`, or its `build`, built before any sample). Every other service with a `build` is
built then too, tagged br-harbor/<task>-<service>:<hash of environment/>. The project is checked at load
(sandboxes/compose_check.py): one that reaches beyond the sample (a privileged service, a published port, a
bind mount outside environment/ ...) refuses the task.
"""

from __future__ import annotations

from agentbatch.harbor.task_fields import TaskError
from agentbatch.sandboxes import compose_binary as compose
from agentbatch.sandboxes.base import ComposeProject, SandboxError

LOG_DIRS = {"VERIFIER_LOGS": "/logs/verifier", "AGENT_LOGS": "/logs/agent", "ARTIFACTS": "/logs/artifacts"}
DEFAULT_CPUS, DEFAULT_MEMORY = "1", "1024M"  # ${CPUS} and ${MEMORY} of a task that sets neither (the flags')
PLACEHOLDER = "br-harbor/main:unbuilt"


def variables(task, main_image: str) -> tuple[tuple[str, str], ...]:
    """What Compose interpolates the task's files with: Harbor's infrastructure variables over the task's env."""
    c = task.config
    env = dict(c.env)
    env.update(
        MAIN_IMAGE_NAME=main_image,
        CONTEXT_DIR=task.file("environment"),
        PREBUILT_IMAGE_NAME=c.docker_image or main_image,
        CPUS=f"{c.cpus:g}" if c.cpus else DEFAULT_CPUS,
        MEMORY=f"{c.memory_mb}M" if c.memory_mb else DEFAULT_MEMORY,
        TEST_DIR="/tests",
        **{f"ENV_{k}_PATH": v for k, v in LOG_DIRS.items()},
    )
    return tuple(sorted(env.items()))


def project(task, built: tuple[tuple[str, str], ...] = (), main_image: str = PLACEHOLDER) -> ComposeProject:
    return ComposeProject(
        directory=task.file("environment"),
        files=(task.file(task.compose_file),),
        env=variables(task, main_image),
        built=built,
        timeout=task.config.build_timeout,
        name=task.name,
        labels=(("batch_runner.harbor", task.name),),
    )


def resolve(task, repository: str) -> tuple[ComposeProject, str | None]:
    """The task's project checked, with its built services tagged, and main's image when the file gives it (None:
    the task's image, docker_image or environment/'s build); TaskError with the reason the project cannot run."""
    missing = compose.unavailable()
    if missing:
        raise TaskError(f"its {task.compose_file} needs Docker Compose: {missing}")
    first = project(task)
    try:
        resolved = compose.config(first, PLACEHOLDER)
    except SandboxError as e:
        raise TaskError(f"{task.compose_file}: {e}") from None
    why = compose.check(first, PLACEHOLDER)
    if why:
        raise TaskError(f"{task.compose_file}: {why}")
    own_image = task.config.docker_image or task.has_dockerfile
    tag = (task.context_hash or "")[:20]
    built = []
    for service, spec in sorted((resolved.get("services") or {}).items()):
        if spec.get("build") and not (service == "main" and own_image):
            built.append((service, f"{repository}-{_safe(service)}:{tag}"))
    main = resolved["services"]["main"]
    main_image = None
    if not own_image:
        main_image = dict(built).get("main") or (main.get("image") if main.get("image") != PLACEHOLDER else None)
        if not main_image:
            raise TaskError(
                f"{task.compose_file}: its main service has no image or build, nor has the task a Dockerfile"
            )
    return project(task, tuple(built), main_image or PLACEHOLDER), main_image


def _safe(service: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in service.lower()).strip("-._") or "service"
