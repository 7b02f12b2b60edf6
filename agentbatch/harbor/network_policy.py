"""A task's network policies, applied as Harbor applies them (its trial/network_policy.py), or the task refused.

Four policies (TaskConfig.policies): the agent's container as it starts ([environment] network_mode) and while
the agent runs ([agent]'s, when set), the verifier's as it starts (in shared mode the same container; a separate
verifier's is [verifier.environment]'s, else a copy of [environment]'s) and while the tests run ([verifier]'s).
A container whose policies are all public has the network as any sample's; all no-network (one container, no
Compose), none at all, as before; any other mix is controlled (base.Egress: docker_egress.py's rules), its
phases switched from the host before the agent's first command and before the tests. Where that control is
impossible (no root, a remote or rootless engine, no iptables), `refusal` says so and the task's samples fail
before any model call: a policy is never left open.
"""

from __future__ import annotations

from agentbatch.harbor.task_config import TaskConfig
from agentbatch.harbor.task_fields import Policy
from agentbatch.sandboxes.base import Egress, Sandbox, SandboxError


def container(policies: list[Policy], compose: bool) -> tuple[bool, Egress | None]:
    """The network (on or not) and egress of a container that goes through these policies, its baseline first."""
    if all(p.mode == "public" for p in policies):
        return True, None
    if all(p.mode == "no-network" for p in policies) and not compose:
        return False, None  # a loopback only, whatever it runs
    return True, Egress(policies[0].allowed)


def agent_container(cfg: TaskConfig, compose: bool) -> tuple[bool, Egress | None]:
    """The agent's container: its baseline and agent phase, and the tests' phase when they run in it."""
    baseline, agent, _, tests = cfg.policies()
    return container([baseline, agent] + ([] if cfg.separate else [tests]), compose)


def verifier_container(cfg: TaskConfig) -> tuple[bool, Egress | None]:
    """A separate verifier's container: its baseline and the tests' phase."""
    _, _, baseline, tests = cfg.policies()
    return container([baseline, tests], False)


def controlled(cfg: TaskConfig, compose: bool) -> bool:
    """Whether any container of the task has its egress controlled (which needs root and iptables here)."""
    return agent_container(cfg, compose)[1] is not None or (cfg.separate and verifier_container(cfg)[1] is not None)


def refusal(cfg: TaskConfig, compose: bool) -> str | None:
    """Why the task's policies cannot be enforced on this machine (its samples fail at once), or None."""
    if not controlled(cfg, compose):
        return None
    from agentbatch.sandboxes import docker_egress

    why = docker_egress.refusal()
    if why is None:
        return None
    modes = sorted({p.mode for p in cfg.policies() if p.mode != "public"})
    return f"its network policy ({', '.join(modes)}) cannot be enforced here: {why}"


def switch(sandbox: Sandbox, current: Policy, wanted: Policy) -> None:
    """A phase's policy in a controlled container (Harbor's _phase_network_policy), when it differs."""
    if wanted == current:
        return
    set_egress = getattr(sandbox, "set_egress", None)
    if set_egress is None:
        raise SandboxError("this sandbox cannot change its network policy")
    set_egress(wanted.allowed)
