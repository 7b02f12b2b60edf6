"""The Docker engine as the docker backend uses it: one client per thread, images made present, containers removed.

Imported when a sample first needs Docker (docker.py), so a run without it never loads the SDK.
"""

from __future__ import annotations

import os
import threading

import docker
import docker.errors
import requests

from agentbatch.sandboxes.base import SandboxError, one_line

# requests errors (engine socket gone, say) are not DockerExceptions but mean the same to us.
ENGINE_ERRORS = (docker.errors.DockerException, requests.RequestException)
_local = threading.local()
_image_lock = threading.Lock()
_image_locks: dict[str, threading.Lock] = {}
_images_present: set[str] = set()


def client() -> docker.DockerClient:
    """This thread's client: the SDK does not promise a client is safe to share, and a fork must not inherit one."""
    found = getattr(_local, "client", None)
    if found is None or _local.pid != os.getpid():
        try:
            found = docker.from_env(timeout=120)
        except docker.errors.DockerException as e:
            raise SandboxError(
                f"cannot reach the Docker engine ({message(e)}); is it running, is DOCKER_HOST right?"
            ) from e
        _local.client, _local.pid = found, os.getpid()
    return found


def ping() -> None:
    """SandboxError unless the engine answers, whatever it fails with: the run stops at start with one line."""
    try:
        docker.from_env(timeout=30).ping()
    except Exception as e:  # no socket, a refused connection, a DOCKER_HOST that is not an engine...
        raise SandboxError(f"no Docker engine answers ({type(e).__name__}); start dockerd or set DOCKER_HOST") from None


def message(e: BaseException) -> str:
    """An engine error as one line: its explanation when the engine gave one."""
    text = getattr(e, "explanation", None) or str(e)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return one_line(str(text))


def ensure_image(image: str) -> None:
    """Make sure the image is here, pulling it if not (once per process); SandboxError at once if it cannot be had."""
    if image in _images_present:
        return
    with _image_lock:
        lock = _image_locks.setdefault(image, threading.Lock())
    with lock:  # parallel samples on one image pull it once
        if image in _images_present:
            return
        engine = client()
        try:
            engine.images.get(image)
        except docker.errors.ImageNotFound:
            try:
                engine.images.pull(image)
            except ENGINE_ERRORS as e:
                raise SandboxError(f"Docker image {image!r} is not here and could not be pulled: {message(e)}") from e
        except ENGINE_ERRORS as e:
            raise SandboxError(f"cannot inspect Docker image {image!r}: {message(e)}") from e
        _images_present.add(image)


def remove(container_id: str) -> bool:
    """Force-remove a container and its anonymous volumes; False if it was gone or the engine is away."""
    try:
        client().api.remove_container(container_id, force=True, v=True)
        return True
    except (docker.errors.DockerException, requests.RequestException, OSError, SandboxError):
        return False  # already gone, or the engine is away: a later reap removes it by its label


def remove_network(name: str) -> bool:
    """Remove a network (its containers gone first); False if it was gone or the engine is away."""
    try:
        client().api.remove_network(name)
        return True
    except (docker.errors.DockerException, requests.RequestException, OSError, SandboxError):
        return False


def remove_labelled(labels: dict[str, str]) -> int:
    """Remove every container carrying all these labels, then the networks and volumes that carry them (a Compose
    project's, a container's own network); how many containers."""
    filters = {"label": [f"{k}={v}" for k, v in labels.items()]}
    api = client().api
    try:
        found = api.containers(all=True, quiet=True, filters=filters)
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot list containers: {message(e)}") from e
    removed = sum(remove(c["Id"]) for c in found)
    try:
        networks = api.networks(filters=filters)
        volumes = api.volumes(filters=filters).get("Volumes") or []
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot list networks and volumes: {message(e)}") from e
    for network in networks:
        remove_network(network["Id"])
    for volume in volumes:
        try:
            api.remove_volume(volume["Name"], force=True)
        except ENGINE_ERRORS:
            pass  # in use by a container being removed, or gone: the next reap
    return removed
