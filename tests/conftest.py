"""Shared fixtures: the Docker ones live in conftest_docker.py."""

from conftest_docker import docker_images, docker_run_name, leftover_containers  # noqa: F401
