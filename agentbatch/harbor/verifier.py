"""A Harbor task's check, after the agent's last turn, in the same container (docs/harbor.md, "The check").

`tests/` is copied to /tests (whatever the agent left there removed first), /logs/verifier is emptied, and
`bash /tests/test.sh` runs within the verifier's timeout. The reward is what it wrote: reward.json (an
object of named numbers, all kept in `check.rewards`; `reward` is its "reward", else reward.txt's number,
else its only value) or reward.txt (one number). The sample passes when the reward is at least 1.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import time

from agentbatch.harbor.task_dir import SOLUTION, TESTS, HarborTask
from agentbatch.sandboxes.base import Sandbox, SandboxError
from agentbatch.tools.registry import cap_output
from agentbatch.verification import MAX_CHECK_OUTPUT, CheckResult

TESTS_DIR, SOLUTION_DIR, VERIFIER_LOGS = "/tests", "/solution", "/logs/verifier"
REWARD_TXT, REWARD_JSON = f"{VERIFIER_LOGS}/reward.txt", f"{VERIFIER_LOGS}/reward.json"
COPY_TIMEOUT = 120.0


def copy_dir(sandbox: Sandbox, source: str, target: str) -> None:
    """Put a task's directory at `target` in the sandbox (anything there before removed), keeping executable bits."""
    _run(sandbox, f"rm -rf {shlex.quote(target)} && mkdir -p {shlex.quote(target)}")
    executable = []
    for top, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, source)
            inside = f"{target}/{rel}"
            with open(path, "rb") as f:  # a symlink was checked to lead inside the task: its file is copied
                sandbox.write_file(inside, f.read())
            if os.stat(path).st_mode & 0o111:
                executable.append(inside)
    for i in range(0, len(executable), 200):  # a few commands, however many files (a command line is bounded)
        _run(sandbox, "chmod +x " + " ".join(shlex.quote(p) for p in executable[i : i + 200]))


def _run(sandbox: Sandbox, command: str) -> None:
    done = sandbox.exec(command, timeout=COPY_TIMEOUT)
    if done.timed_out or done.exit_code != 0:
        raise SandboxError(f"{command[:80]!r} failed in the container: {' '.join(done.output.split())[-300:]}")


def copy_solution(sandbox: Sandbox, task: HarborTask) -> None:
    """/solution for an oracle run, just before the agent's first command."""
    copy_dir(sandbox, task.file(SOLUTION), SOLUTION_DIR)


def run_tests(sandbox: Sandbox, task: HarborTask, timeout: float) -> CheckResult:
    """Copy the tests in, run them, read the reward; a check that cannot run is status "error", never raised."""
    start = time.monotonic()
    try:
        result = _run_tests(sandbox, task, timeout)
    except (SandboxError, OSError) as e:  # the container is gone, or refused the files
        result = CheckResult(status="error", output=cap_output(f"the check could not run: {e}", MAX_CHECK_OUTPUT))
    result.seconds = time.monotonic() - start
    return result


def _run_tests(sandbox: Sandbox, task: HarborTask, timeout: float) -> CheckResult:
    # Nothing the agent wrote may stand for the verifier's files: neither tests nor a reward.
    copy_dir(sandbox, task.file(TESTS), TESTS_DIR)
    _run(sandbox, f"rm -rf {VERIFIER_LOGS} && mkdir -p {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS}")
    env = "".join(f"export {k}={shlex.quote(v)}; " for k, v in task.config.verifier_env.items() if k.isidentifier())
    done = sandbox.exec(f"{env}bash {TESTS_DIR}/test.sh", timeout=timeout)
    output = cap_output(done.output, MAX_CHECK_OUTPUT)
    if done.timed_out:
        return CheckResult(status="timeout", output=output)
    rewards, problem = read_rewards(sandbox)
    if problem:
        note = f"\n[the check gave no result: {problem}; test.sh exited with {done.exit_code}]"
        return CheckResult(
            status="error", exit_code=done.exit_code, output=cap_output(done.output + note, MAX_CHECK_OUTPUT)
        )
    reward = rewards["reward"]
    passed = reward >= 1.0  # partial credit counts in the mean reward, not in the pass rate
    return CheckResult(
        status="passed" if passed else "failed",
        reward=reward,
        passed=passed,
        exit_code=done.exit_code,
        output=output,
        rewards=rewards,
    )


def read_rewards(sandbox: Sandbox) -> tuple[dict[str, float], str | None]:
    """The named rewards test.sh wrote (always with "reward"), or why there are none."""
    found_json = _read(sandbox, REWARD_JSON)
    found_txt = _read(sandbox, REWARD_TXT)
    txt, txt_problem = _number(found_txt) if found_txt is not None else (None, None)
    if found_json is not None:
        try:
            parsed = json.loads(found_json)
        except (ValueError, RecursionError):
            return {}, f"{REWARD_JSON} is not valid JSON"
        if not isinstance(parsed, dict):
            return {}, f"{REWARD_JSON} is not a JSON object"
        rewards = {
            str(k): float(v)
            for k, v in parsed.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if "reward" not in rewards:
            if txt is not None:
                rewards["reward"] = txt
            elif len(rewards) == 1:
                rewards["reward"] = next(iter(rewards.values()))
            else:
                return {}, f'{REWARD_JSON} has no numeric "reward" (and there is no {REWARD_TXT})'
        return rewards, None
    if found_txt is not None:
        if txt is None:
            return {}, txt_problem
        return {"reward": txt}, None
    return {}, f"test.sh wrote neither {REWARD_TXT} nor {REWARD_JSON}"


def _read(sandbox: Sandbox, path: str) -> str | None:
    try:
        return sandbox.read_file(path, limit=1_000_000).decode("utf-8", "replace")
    except (FileNotFoundError, IsADirectoryError):
        return None


def _number(text: str) -> tuple[float | None, str | None]:
    try:
        value = float(text.strip())
    except ValueError:
        return None, f"{REWARD_TXT} holds {text.strip()[:40]!r}, not a number"
    if not math.isfinite(value):
        return None, f"{REWARD_TXT} holds {text.strip()[:40]!r}, not a finite number"
    return value, None
