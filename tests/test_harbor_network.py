"""A task's network policies through the real CLI and real Docker (docs/harbor.md, "Network policies"): an
allowlist lets the agent's container reach one host and refuses the other, both hosts run by the test itself on a
network of the task's own (never a real address); the agent's phase and the verifier's are switched as Harbor
switches them, and a separate verifier's network reaches none of the agent's; no raw socket goes around the rules; a policy this machine cannot enforce refuses the task before
any token is spent."""

from __future__ import annotations

import pytest
from cli_helpers import RunDir, run_cli_wrapped
from harbor_helpers import BUSYBOX, FETCH, WEB, by_task, harbor_run, labelled, nothing_left, write_task

pytestmark = pytest.mark.docker

# Two hosts of the test's own, on an internal network of the task (nothing outside this machine is ever asked).
HOST = {**WEB, "command": ["sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8000 -h /www"]}
HOSTS = {
    "services": {
        "main": {
            "networks": ["default", "outside"],
            "depends_on": {n: {"condition": "service_healthy"} for n in ("allowed-host", "refused-host")},
        },
        "allowed-host": {**HOST, "networks": ["outside"]},
        "refused-host": {**HOST, "networks": ["outside"]},
        "web": WEB,  # the task's own service, on the sample's default network: reachable whatever the policy
    },
    "networks": {"outside": {"internal": True}},
}
PROBE = (
    FETCH
    + "\necho $(fetch http://allowed-host:8000/) $(fetch http://refused-host:8000/) $(fetch http://web:8000/)"
    + " $(ping -c 1 -W 1 127.0.0.1 >/dev/null 2>&1 && echo raw || echo no-raw)"
)
SOLVE = PROBE + " > /logs/artifacts/agent.txt\ncat /logs/artifacts/agent.txt\n"
# The tests write what they saw as their reward's reason, and pass when both phases saw what the policy says.
TEST = (
    PROBE
    + """ > /tmp/verifier.txt
agent=$(cat /logs/artifacts/agent.txt); verifier=$(cat /tmp/verifier.txt)
echo "agent: $agent; verifier: $verifier"
[ "$agent" = "$AGENT" ] && [ "$verifier" = "$VERIFIER" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
)


def policy_task(root, name: str, agent: str, verifier: str, environment="", agent_phase="", verifier_phase=""):
    """A task whose tests pass when the agent saw `agent` and the tests `verifier` (fetches, then raw sockets)."""
    toml = f'[verifier]\nenv = {{ AGENT = "{agent}", VERIFIER = "{verifier}" }}\n{verifier_phase}'
    toml += (f"[agent]\n{agent_phase}" if agent_phase else "") + (
        f"[environment]\n{environment}" if environment else ""
    )
    return write_task(root, name, TEST, SOLVE, toml=toml, compose=HOSTS)


def test_an_allowlist_reaches_its_host_refuses_the_other_and_each_phase_gets_its_own(
    tmp_path, compose_binary, docker_run_name
):
    root = tmp_path / "tasks"
    allow = 'network_mode = "allowlist"\nallowed_hosts = ["allowed-host"]\n'
    policy_task(root, "allowlist", "ok refused ok no-raw", "ok refused ok no-raw", environment=allow)
    # [agent] and [verifier] overrides, each during its phase only (Harbor's _phase_network_policy).
    policy_task(
        root,
        "phases",
        "refused refused ok no-raw",
        "refused ok ok no-raw",
        environment=allow,
        agent_phase='network_mode = "no-network"\n',
        verifier_phase='network_mode = "allowlist"\nallowed_hosts = ["refused-host"]\n',
    )
    policy_task(root, "public", "ok ok ok raw", "ok ok ok raw")  # no policy: nothing controlled
    # A separate verifier's network is set apart from the agent's: none of the sample's services, by any name.
    policy_task(
        root,
        "separate",
        "ok ok ok raw",
        "refused refused refused raw",
        verifier_phase='environment_mode = "separate"\n',
    )
    out = tmp_path / "out"

    done = harbor_run(root, out, docker_run_name, "--model=oracle")

    assert done.returncode == 0, done.stderr
    lines = by_task(RunDir(out / docker_run_name).trajectories())
    for name in ("allowlist", "phases", "public", "separate"):
        assert lines[name]["passed"], (name, lines[name]["check"]["output"])
    assert nothing_left(out / docker_run_name), labelled(out / docker_run_name)


def test_a_policy_that_cannot_be_enforced_refuses_the_task_before_any_token(tmp_path, docker_images, docker_run_name):
    root = tmp_path / "tasks"
    write_task(
        root,
        "no-network",
        "echo 1 > /logs/verifier/reward.txt\n",
        toml='[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["10.0.0.1"]\n',
    )
    write_task(root, "open", "echo 1 > /logs/verifier/reward.txt\n")
    prelude = (
        "import agentbatch.sandboxes.docker_egress as egress\n"
        "egress.refusal = lambda: 'the runner is not root, so it cannot set firewall rules (as this test says)'\n"
    )
    args = [f"--dataset_file={root}", "--batch_size=5", f"--run_name={docker_run_name}", f"--output_dir={tmp_path}/out"]
    done = run_cli_wrapped(prelude, [*args, "--model=oracle"], tmp_path)

    assert done.returncode == 3, done.stderr
    run = RunDir(tmp_path / "out" / docker_run_name)
    assert [r["task"]["name"] for r in run.trajectories()] == ["open"]
    [failed] = run.failed()
    assert failed["error"] == (
        "its network policy (allowlist) cannot be enforced here: the runner is not root, so it cannot set firewall "
        "rules (as this test says)"
    )
    assert failed["usage"]["total_tokens"] == 0 and failed["task"]["image"] == BUSYBOX
