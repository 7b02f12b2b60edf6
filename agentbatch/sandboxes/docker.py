"""The docker backend: one labelled container per sample, from the row's image (or the one its build made) or the
run's default; or a Compose project of several (compose.py), the sandbox being its main service.

This module only registers it: the docker SDK (docker_engine.py, docker_images.py, docker_container.py) is
imported when a run first needs it, so runs that never use Docker never load it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import Backend, Prepared, SandboxError, SandboxSettings, SandboxSpec

if TYPE_CHECKING:
    from agentbatch.sandboxes.docker_container import DockerSandbox


@registry.backend("docker")
class DockerBackend(Backend):
    """A container per sample: created at its first tool call, force-removed at its end, reaped by its labels."""

    takes_images = True

    def prepare_run(self, settings: SandboxSettings) -> str:
        """The engine answers (SandboxError if not: the run stops at start); the line the run prints."""
        from agentbatch.sandboxes import docker_engine

        docker_engine.ping()
        return f"sandbox: docker ({'network on' if settings.network else 'no network'})"

    def prepare_all(self, specs: list[SandboxSpec], parallel: int, log: Callable[[str], None]) -> list[Prepared]:
        """Every build's image built or found, `parallel` at once, and every image's id if it is here
        (docker_images.py)."""
        from agentbatch.sandboxes import compose, docker_images

        prepared = docker_images.prepare_all(specs, parallel, log)
        compose.prepare_all(specs, prepared, parallel, log)  # the services a Compose project builds
        return prepared

    def prepare(self, spec: SandboxSpec) -> None:
        """The image is here (pulled if not, once per process); SandboxError at once if it cannot be had."""
        image = spec.image or spec.settings.docker_image
        if not image:
            raise SandboxError("no Docker image given: set the default image flag or the row's image")
        if spec.cwd and not posixpath.isabs(spec.cwd):
            raise SandboxError(f"cwd {spec.cwd!r} must be an absolute path inside the container")
        from agentbatch.sandboxes import docker_engine

        docker_engine.ensure_image(image)

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        if spec.resources is not None and spec.resources.compose is not None:
            from agentbatch.sandboxes.compose import ComposeSandbox

            return ComposeSandbox(spec)  # several containers: the sandbox is the project's main service
        from agentbatch.sandboxes.docker_container import DockerSandbox

        return DockerSandbox(spec)

    def cleanup(self, sandbox: DockerSandbox, interrupted: bool) -> None:
        sandbox.cleanup()

    def reap(self, labels: dict[str, str]) -> int:
        """Remove every container carrying all these labels (a dead session's, see base.RUN_DIR_LABEL); how many."""
        from agentbatch.sandboxes import docker_engine

        return docker_engine.remove_labelled(labels)

    def reaped(self, n: int, whose: str) -> str:
        return f"removed {n} containers {whose}"

    def save_state(self, sandbox: DockerSandbox, out: BinaryIO, limit: int) -> dict:
        """What changed in the container since it was made from its image (docker_state.py), not only its workdir."""
        from agentbatch.sandboxes import docker_state

        return docker_state.save(sandbox, out, limit)

    def restore_state(self, sandbox: DockerSandbox, files: BinaryIO, notes: dict) -> None:
        from agentbatch.sandboxes import docker_state

        docker_state.restore(sandbox, files, notes)
