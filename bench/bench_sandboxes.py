"""(13) What a sandbox costs a prompt: 500 prompts with one terminal command each, bwrap vs local vs docker.

Each prompt's replies call `terminal` once (`echo hello`), then answer. One worker runs one prompt at a
time against a zero-latency scripted server, so a prompt's wall time is the runner's own work plus its
sandbox, and the difference between two sandboxes is what one costs over the other per prompt (making
the sandbox, one command in it, removing it). The run phase comes from statistics.json, so interpreter
start-up and worker spawning are left out.
"""

from __future__ import annotations

import subprocess

from common import Server, report, run_cli, write_dataset

REPLIES = [
    {"reasoning": "Run it.", "tool_calls": [{"name": "terminal", "arguments": {"command": "echo hello"}}]},
    {"reasoning": "It printed hello.", "content": "Done: it printed hello."},
]
DOCKER_IMAGES = ("br-test-busybox:1", "python:3.11-slim")  # the test image (tests/build_test_image.sh) if built


def _docker_image() -> str | None:
    for image in DOCKER_IMAGES:
        found = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
        if found.returncode == 0:
            return image
    return None


def bench_sandboxes(results: dict, n: int = 500, rounds: int = 5) -> None:
    """(13) per-prompt wall and CPU time of each sandbox, and bwrap's and docker's overhead over local.

    The n prompts run in `rounds` runs per sandbox, the sandboxes taking turns, so a change in the shared
    machine's load falls on all of them alike.
    """
    from agentbatch.sandboxes import containment

    per_round = n // rounds
    dataset = write_dataset(per_round)
    image = _docker_image()
    kinds = [("local", []), ("bwrap", [])]
    kinds += [("docker", [f"--docker_image={image}"])] if image else []
    runs: dict[str, list[dict]] = {kind: [] for kind, _ in kinds}
    for i in range(rounds):
        for kind, extra in kinds:
            with Server(latency=0.0, script=REPLIES) as srv:
                flags = ["--num_workers=1", "--concurrency=1", "--distribution=terminal_only", f"--sandbox={kind}"]
                r = run_cli(f"sandbox_{kind}_{i}", dataset, srv.base_url, *flags, *extra)
            if r["samples"]["done"] != per_round or r["api_calls"] != 2 * per_round:
                raise RuntimeError(f"sandbox {kind}: expected {per_round} prompts done, 2 calls each, got {r}")
            runs[kind].append(r)
    total = {k: per_round * len(rs) for k, rs in runs.items()}
    wall = {k: sum(r["run_seconds"] for r in rs) / total[k] for k, rs in runs.items()}
    cpu = {k: sum(r["cpu"] for r in rs) / total[k] for k, rs in runs.items()}
    results["sandboxes"] = {"runs": runs, "wall_per_prompt": wall, "cpu_per_prompt": cpu}
    for kind, rs in runs.items():
        over = (wall[kind] - wall["local"]) * 1000
        loads = [r["loadavg"][0] for r in rs]
        note = ""
        if kind == "bwrap":
            note = f" [target <= 50 ms over local: {'met' if over <= 50 else 'NOT met'}]"
        elif kind == "local":
            note = f" (containment: {containment.best()})"
        elif kind == "docker":
            note = f" ({image})"
        report(
            results,
            f"sandbox_{kind}",
            f"(13) {kind}: {total[kind]} prompts x 1 command, one at a time, in {len(rs)} runs: "
            f"{wall[kind] * 1000:.1f} ms/prompt wall ({over:+.1f} ms over local), runner CPU "
            f"{cpu[kind] * 1000:.1f} ms/prompt, load {min(loads):.1f}-{max(loads):.1f} during the runs{note}",
        )
