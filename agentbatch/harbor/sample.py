"""What a worker does for one sample of a Harbor task, around the agent loop (docs/harbor.md): its TaskHooks.

Before the agent: nothing of the task's tests or solution is in its container (only an oracle run gets
/solution, just before its one command), and what the tests will run with is noted (container.probe).
After: the verifier (verifier.py), within the check's time limit the runner gives (the task's own, bounded by
the run's flags). The container's resources are the task's (`resources`), given with its entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentbatch.harbor import container, oracle, verifier
from agentbatch.harbor.container import Probe
from agentbatch.harbor.task_dir import SOLVE_SCRIPT, HarborTask
from agentbatch.limits import TaskLimits
from agentbatch.sandboxes.base import Resources, SandboxError
from agentbatch.task_hooks import HookContext, TaskHooks
from agentbatch.verification import CheckResult


@dataclass
class HarborHooks(TaskHooks):
    """A Harbor task's part in each of its samples: the container noted (and /solution for the oracle), its tests."""

    task: HarborTask

    def before_agent(self, sample: HookContext) -> Probe:
        """What the check will need of the container as the image made it (container.probe), and an oracle run's
        /solution, copied in before its first command; SandboxError if the container cannot run them."""
        sandbox = sample.sandbox()
        before = container.probe(sandbox)
        if sample.model == oracle.NAME:
            if not os.path.isfile(self.task.file(SOLVE_SCRIPT)):
                raise SandboxError(f"no {SOLVE_SCRIPT}: the task has no reference solution for the oracle to run")
            verifier.copy_solution(sandbox, self.task, before)
        return before

    def check(self, sample: HookContext, before: Probe) -> CheckResult:
        """The task's tests, after the agent's last turn; `before` is what before_agent returned."""
        return verifier.run_tests(sample.sandbox(), self.task, sample.check_timeout, before)

    def before_replay(self, sample: HookContext) -> Probe:
        """A rescore's fresh container, before the sample's state goes in: what its tests will run with, as the image
        made it (its /solution, if an oracle run's, is in the kept state)."""
        return container.probe(sample.sandbox())


def limits(task: HarborTask) -> TaskLimits:
    """The task's own: [agent] timeout_sec for its samples, [verifier] timeout_sec for its check."""
    return TaskLimits(task.config.agent_timeout, task.config.verifier_timeout)


def resources(task: HarborTask) -> Resources:
    """The task's container resources: cpus, memory, storage, and no network unless it allows the internet."""
    c = task.config
    # A task written for a bigger machine still runs here, on all of this one's (the engine refuses more).
    cpus = min(c.cpus, float(os.cpu_count() or 1)) if c.cpus else None
    return Resources(
        cpus=cpus,
        memory_mb=c.memory_mb,
        storage_mb=c.storage_mb,
        network=c.allow_internet,
        env=tuple(c.env.items()),
    )
