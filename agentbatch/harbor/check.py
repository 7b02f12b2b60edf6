"""A Harbor task's check, after the agent's last turn, in Harbor's order (its trial/single_step.py).

Every process the agent left running is ended first (a script of shell builtins, as root), and the container is
back on its network baseline; then the task's [[verifier.collect]] hooks of main run and main's artifacts are
collected, then those of the other services (in separate mode once main is stopped). Shared mode (the
default): the tests run in the agent's container, with the verifier's network policy (verifier.py). Separate
mode: the agent's whole environment is stopped and the tests run in a container of their own, which gets the
collected artifacts and nothing else (separate_verifier.py). Whatever the outcome, the collected artifacts go
back with the result, for the run directory.
"""

from __future__ import annotations

import shlex
import time

from agentbatch.harbor import artifacts, container, network_policy, separate_verifier
from agentbatch.harbor.container import Probe
from agentbatch.harbor.task_dir import HarborTask
from agentbatch.harbor.task_fields import MAIN
from agentbatch.harbor.verifier import tests
from agentbatch.sandboxes.base import Sandbox, SandboxError, SandboxSpec
from agentbatch.tools.registry import cap_output
from agentbatch.verification import MAX_CHECK_OUTPUT, CheckResult


def run_check(
    sandbox: Sandbox,
    task: HarborTask,
    timeout: float,
    before: Probe,
    spec: SandboxSpec,
    oracle: bool = False,
    verifier_image: str | None = None,
) -> CheckResult:
    """Everything after the agent (module docstring); never raises ("error" instead). `spec` is the sample's
    sandbox's, which a separate verifier's is made like; `verifier_image` the one built from tests/."""
    start = time.monotonic()
    collected = artifacts.Collected()
    try:
        result = _check(sandbox, task, timeout, before, spec, collected, oracle, verifier_image)
    except (SandboxError, OSError) as e:  # the container is gone, or refused the files
        result = CheckResult(status="error", output=cap_output(f"the check could not run: {e}", MAX_CHECK_OUTPUT))
    result.files = collected.output()
    result.seconds = time.monotonic() - start
    return result


def _check(
    sandbox: Sandbox,
    task: HarborTask,
    timeout: float,
    before: Probe,
    spec: SandboxSpec,
    collected: artifacts.Collected,
    oracle: bool,
    verifier_image: str | None,
) -> CheckResult:
    cfg = task.config
    baseline, agent, _, tests_phase = cfg.policies()
    # Nothing the agent started may run beside the tests, and nothing it wrote may stand for the verifier's files.
    container.end_processes(sandbox)
    network_policy.switch(sandbox, agent, baseline)
    services = getattr(sandbox, "service", lambda _name: sandbox)
    notes = _collect(services, task, before, {MAIN})
    artifacts.collect(services, cfg.artifacts, {MAIN}, collected)
    sidecars = cfg.services()
    if cfg.separate:
        stop = getattr(sandbox, "stop", None)
        if sidecars and stop is not None:
            stop(MAIN)  # as Harbor: the agent's processes cannot touch what the other services hand over
        notes += _collect(services, task, None, sidecars)
        artifacts.collect(services, cfg.artifacts, sidecars, collected)
        if stop is not None:
            stop()  # the agent's whole environment, before the verifier starts
        return separate_verifier.run(task, timeout, collected, notes, spec, oracle, verifier_image)
    notes += _collect(services, task, None, sidecars)
    artifacts.collect(services, cfg.artifacts, sidecars, collected)
    network_policy.switch(sandbox, baseline, tests_phase)
    return tests(sandbox, task, timeout, before, notes, oracle)


def _collect(services, task: HarborTask, before: Probe | None, which: set[str]) -> str:
    """Run the task's [[verifier.collect]] hooks of these services, best effort as in Harbor, each as its user
    (else its image's); a note per hook that failed."""
    notes = []
    for hook in task.config.collect:
        if hook.service not in which:
            continue
        try:
            sandbox = services(hook.service)
            command = f"export PATH={shlex.quote(before.path)}; {hook.command}" if before is not None else hook.command
            done = container.exec_as(sandbox, command, hook.timeout, hook.user or "")
        except SandboxError as e:
            notes.append(f"[collect hook {hook.command[:60]!r} in {hook.service} could not run: {e}]\n")
            continue
        if done.timed_out or done.exit_code != 0:
            how = f"ran past {hook.timeout:g} s" if done.timed_out else f"exited with {done.exit_code}"
            last = (done.output.strip().splitlines() or [""])[-1][-200:]
            notes.append(f"[collect hook {hook.command[:60]!r} {how}: {last}]\n")
        if hook.service == MAIN:
            container.end_processes(sandbox)  # what a hook started is not the tests' either
    return "".join(notes)
