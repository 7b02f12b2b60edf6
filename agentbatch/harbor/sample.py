"""What a worker does for one sample of a Harbor task, around the agent loop (docs/harbor.md): its TaskHooks.

Before the agent: the task's environment is up (its Compose services healthy, its network baseline set), its
[environment] healthcheck passes, and what the tests will run with is noted (container.probe); nothing of the
task's tests or solution is in its container (only an oracle run gets /solution, just before its one command);
then the agent's network policy, if [agent] sets one; the task's skills listed after its instruction (skills.py).
The agent's commands run as [agent] user. Its tools are the run's and the task's own MCP servers' (task_mcp.py).
After: the check (check.py), within the check's time limit the runner gives. The container's resources are the
task's (`resources`), given with its entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentbatch.harbor import check, container, network_policy, oracle, separate_verifier, verifier
from agentbatch.harbor.container import Probe
from agentbatch.harbor.task_dir import SOLVE_SCRIPT, HarborTask
from agentbatch.limits import TaskLimits
from agentbatch.sandboxes.base import Resources, SandboxError
from agentbatch.task_hooks import HookContext, TaskHooks
from agentbatch.verification import CheckResult

LOG_DIRS = "/logs/agent /logs/artifacts"


@dataclass
class HarborHooks(TaskHooks):
    """A Harbor task's part in each of its samples: its environment readied, its own tools, its check."""

    task: HarborTask
    verifier_image: str | None = None  # a separate verifier's image built from tests/ (run.ready sets it)
    mcp: tuple = ()  # the task's MCP servers and the tools each listed at start (task_mcp.Listed)

    def before_agent(self, sample: HookContext) -> Probe:
        """The environment checked and noted before the agent's first command (module docstring); SandboxError if
        it cannot run the task: the sample fails, no token spent."""
        sandbox = sample.sandbox()
        cfg = self.task.config
        separate_verifier.ensure_image(self.task, sample.tools.spec)
        if cfg.environment.healthcheck is not None:
            container.healthcheck(sandbox, cfg.environment.healthcheck)
        before = container.probe(sandbox)
        # Harbor mounts these, empty and writable by any user: the agent's logs and what it publishes.
        container.run(sandbox, f"mkdir -p {LOG_DIRS} && chmod 777 {LOG_DIRS}")
        if sample.model == oracle.NAME:
            if not os.path.isfile(self.task.file(SOLVE_SCRIPT)):
                raise SandboxError(f"no {SOLVE_SCRIPT}: the task has no reference solution for the oracle to run")
            verifier.copy_solution(sandbox, self.task, before)
        baseline, agent, _, _ = cfg.policies()
        network_policy.switch(sandbox, baseline, agent)
        return before

    def tools(self, sample: HookContext, before: Probe) -> list:
        """The task's own MCP servers' tools, connected to this sample's servers (task_mcp.py)."""
        if not self.mcp:
            return []
        from agentbatch.harbor import task_mcp

        return task_mcp.sample_tools(self.mcp)

    def prompt(self, sample: HookContext, before: Probe, prompt: str) -> str:
        """The instruction, and the task's skills ([environment] skills_dir) listed after it as Harbor's agent
        lists them (skills.py)."""
        skills_dir = self.task.config.environment.skills_dir
        if not skills_dir:
            return prompt
        from agentbatch.harbor import skills

        return prompt + skills.section(sample.sandbox(), skills_dir)

    def check(self, sample: HookContext, before: Probe) -> CheckResult:
        """The task's collect hooks, artifacts and tests, after the agent's last turn (check.py)."""
        return check.run_check(
            sample.sandbox(),
            self.task,
            sample.check_timeout,
            before,
            sample.tools.spec,
            sample.model == oracle.NAME,
            self.verifier_image,
        )

    def before_replay(self, sample: HookContext) -> Probe:
        """A rescore's fresh container, before the sample's state goes in: what its tests will run with, as the image
        made it (its /solution, if an oracle run's, is in the kept state)."""
        return container.probe(sample.sandbox())


def limits(task: HarborTask) -> TaskLimits:
    """The task's own: [agent] timeout_sec for its samples, [verifier] timeout_sec for its check."""
    return TaskLimits(task.config.agent_timeout, task.config.verifier_timeout)


def resources(task: HarborTask) -> Resources:
    """The task's container: cpus, memory, storage, variables, the agent's user, its network policies (on, off or
    controlled: network_policy.py), and its Compose project when it has several containers."""
    c = task.config
    # A task written for a bigger machine still runs here, on all of this one's (the engine refuses more).
    cpus = min(c.cpus, float(os.cpu_count() or 1)) if c.cpus else None
    network, egress = network_policy.agent_container(c, task.compose is not None)
    return Resources(
        cpus=cpus,
        memory_mb=c.memory_mb,
        storage_mb=c.storage_mb,
        network=network,
        env=tuple(c.env.items()),
        user=c.agent_user,
        egress=egress,
        compose=task.compose,
    )
