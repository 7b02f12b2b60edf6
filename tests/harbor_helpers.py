"""Harbor task directories written by a test, and what a run left labelled in the engine (containers, networks,
volumes), for the tests of Harbor tasks in full: Compose services, separate verifiers, network policies, users,
MCP servers and artifacts. The tasks run on the busybox test images (tests/build_test_image.sh): nothing to build
or pull, so each test pays for its containers only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import docker
from cli_helpers import run_cli

BUSYBOX = "br-test-busybox:1"
RUN_DIR_LABEL = "batch_runner.run_dir"
# A web server of busybox, healthy once it answers: Compose's depends_on waits for it.
WEB = {
    "image": BUSYBOX,
    "command": ["sh", "-c", "mkdir -p /www && echo hello from web > /www/index.html && exec httpd -f -p 8000 -h /www"],
    "healthcheck": {
        "test": ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8000/"],
        "interval": "1s",
        "timeout": "3s",
        "retries": 20,
    },
}
# busybox 1.35's wget -T segfaults: a bounded fetch is `timeout` around it (prints "ok", else why not).
FETCH = 'fetch() { if busybox timeout 5 wget -q -O - "$1" >/dev/null 2>/tmp/err; then echo ok; else echo refused; fi; }'


def write_task(
    root: Path,
    name: str,
    test_sh: str,
    solve_sh: str = "true\n",
    toml: str = "",
    compose: dict | None = None,
    files: dict[str, str] | None = None,
    image: str | None = BUSYBOX,
    top: str = "",
) -> Path:
    """A task: its task.toml (`top`-level keys, [task], then `toml`'s tables, [environment] docker_image = `image`
    unless it is None), tests/test.sh, solution/solve.sh, environment/docker-compose.yaml (`compose`, as JSON:
    YAML reads it) and other `files`."""
    path = root / name
    for sub in ("environment", "tests", "solution"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    if image:
        line = f'docker_image = "{image}"\n'
        toml = (
            toml.replace("[environment]\n", "[environment]\n" + line, 1)
            if "[environment]\n" in toml
            else toml + "\n[environment]\n" + line
        )
    (path / "task.toml").write_text(f'schema_version = "1.4"\n{top}[task]\nname = "{name}"\n{toml}')
    (path / "instruction.md").write_text(f"Task {name}: do what the tests want.\n")
    (path / "tests" / "test.sh").write_text("#!/bin/sh\n" + test_sh)
    (path / "solution" / "solve.sh").write_text("#!/bin/sh\n" + solve_sh)
    if compose is not None:
        (path / "environment" / "docker-compose.yaml").write_text(json.dumps(compose, indent=1))
    for rel, text in (files or {}).items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def harbor_run(root: Path, out: Path, run_name: str, *extra: str, server=None, timeout: float = 300):
    args = [f"--dataset_file={root}", "--batch_size=10", f"--run_name={run_name}", f"--output_dir={out}", *extra]
    return run_cli(args, root.parent, server=server, timeout=timeout)


def labelled(run_dir: Path) -> dict[str, list[str]]:
    """Containers, networks and volumes labelled with the run directory: what a run left in the engine."""
    api = docker.from_env().api
    label = {"label": f"{RUN_DIR_LABEL}={os.path.realpath(run_dir)}"}
    return {
        "containers": [c["Names"][0] for c in api.containers(all=True, filters=label)],
        "networks": [n["Name"] for n in api.networks(filters=label)],
        "volumes": [v["Name"] for v in api.volumes(filters=label).get("Volumes") or []],
    }


def nothing_left(run_dir: Path) -> bool:
    return not any(labelled(run_dir).values())


def by_task(lines: list[dict]) -> dict[str, dict]:
    return {r["task"]["name"]: r for r in lines}
