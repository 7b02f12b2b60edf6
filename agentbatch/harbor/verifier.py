"""The tests of a Harbor task in a container, and the reward they give (docs/harbor.md, "The check").

`tests/` is copied to /tests (whatever the agent left there removed first; or nowhere, when the verifier's image
holds them), /logs/verifier is emptied, and `/tests/test.sh` runs as [verifier] user, within the verifier's
timeout, with the interpreter and PATH the image had before the agent's first command and the task's [verifier]
env. The reward is what test.sh wrote: reward.json (an object of named numbers, all kept in `check.rewards`;
`reward` is its "reward", else reward.txt's number, else its only value) or reward.txt (one number). A "reward"
that is not a finite number is a check error, never a pass. The sample passes when the reward is at least 1.
What comes before (the agent's processes ended, the collect hooks, the artifacts, which container) is check.py's.
"""

from __future__ import annotations

import json
import math
import shlex

from agentbatch.harbor import container
from agentbatch.harbor.container import Probe
from agentbatch.harbor.names import SOLUTION_DIR, TESTS_DIR, VERIFIER_LOGS
from agentbatch.harbor.task_dir import SOLUTION, TESTS, HarborTask
from agentbatch.sandboxes.base import Sandbox
from agentbatch.tools.registry import cap_output
from agentbatch.verification import MAX_CHECK_OUTPUT, CheckResult

REWARD_TXT, REWARD_JSON = f"{VERIFIER_LOGS}/reward.txt", f"{VERIFIER_LOGS}/reward.json"
MAX_REWARD_BYTES = 1_000_000


def copy_solution(sandbox: Sandbox, task: HarborTask, owner: Probe) -> None:
    """/solution for an oracle run, just before the agent's first command; solve.sh executable, as Harbor makes it."""
    container.put_dir(sandbox, task.file(SOLUTION), SOLUTION_DIR, owner)
    container.run(sandbox, f"chmod +x {SOLUTION_DIR}/solve.sh")


def tests(
    sandbox: Sandbox, task: HarborTask, timeout: float, before: Probe, notes: str, oracle: bool, copy: str = TESTS_DIR
) -> CheckResult:
    """tests/ copied to `copy` (None: the image holds them), /logs/verifier emptied, test.sh run as [verifier]
    user, its reward read."""
    if copy == TESTS_DIR:
        container.put_dir(sandbox, task.file(TESTS), TESTS_DIR, before)
    elif copy:
        container.put_dir(sandbox, task.file(TESTS), copy, before, replace=False)
    container.run(sandbox, f"rm -rf {VERIFIER_LOGS} && mkdir -p {VERIFIER_LOGS} && chmod 777 {VERIFIER_LOGS}")
    command = _command(task, before, f"{shlex.quote(before.bash)} {TESTS_DIR}/test.sh", oracle)
    done = container.exec_as(sandbox, command, timeout, task.config.verifier_user or "")
    output = cap_output(notes + done.output, MAX_CHECK_OUTPUT)
    if done.timed_out:
        return CheckResult(status="timeout", output=output)
    rewards, problem = read_rewards(sandbox)
    if problem:
        note = f"\n[the check gave no result: {problem}; test.sh exited with {done.exit_code}]"
        return CheckResult(
            status="error", exit_code=done.exit_code, output=cap_output(notes + done.output + note, MAX_CHECK_OUTPUT)
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


def _command(task: HarborTask, before: Probe, command: str, oracle: bool = False) -> str:
    """A command with the PATH of the image and the task's [verifier] env; an oracle run's [solution] env, which
    its container had for solve.sh, is taken away again (Harbor scopes it to solve.sh)."""
    cfg = task.config
    env = {"PATH": before.path, **{k: v for k, v in cfg.verifier_env.items() if k.isidentifier()}}
    solution = [k for k in cfg.solution_env if k.isidentifier() and k not in env] if oracle else []
    restore = {k: cfg.env[k] for k in solution if k in cfg.env}
    unset = "".join(f"unset {k}; " for k in solution if k not in restore)
    exports = {**restore, **env}
    return unset + "".join(f"export {k}={shlex.quote(v)}; " for k, v in exports.items()) + command


def read_rewards(sandbox: Sandbox) -> tuple[dict[str, float], str | None]:
    """The named rewards test.sh wrote (always with "reward"), or why there are none."""
    found_json, json_problem = _read(sandbox, REWARD_JSON)
    found_txt, txt_problem = _read(sandbox, REWARD_TXT)
    if json_problem or (found_json is None and txt_problem):
        return {}, json_problem or txt_problem
    txt, txt_problem = _text_reward(found_txt) if found_txt is not None else (None, txt_problem)
    if found_json is None:
        if found_txt is None:
            return {}, f"test.sh wrote neither {REWARD_TXT} nor {REWARD_JSON}"
        return ({"reward": txt}, None) if txt is not None else ({}, txt_problem)
    try:
        parsed = json.loads(found_json)
    except (ValueError, RecursionError):  # ValueError also covers integers past Python's digit limit
        return {}, f"{REWARD_JSON} is not valid JSON"
    if not isinstance(parsed, dict):
        return {}, f"{REWARD_JSON} is not a JSON object"
    numbers = {str(k): v for k, v in parsed.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    rewards = {k: f for k, v in numbers.items() if (f := finite(v)) is not None}
    if "reward" in parsed:  # present: it is the reward, or there is none (never another value in its place)
        if "reward" not in rewards:
            return {}, f'{REWARD_JSON}\'s "reward" is {_shown(parsed["reward"])}, not a finite number'
    elif txt is not None:
        rewards["reward"] = txt
    elif len(numbers) == 1:  # text fields are not rewards
        key = next(iter(numbers))
        if key not in rewards:
            return {}, f"{REWARD_JSON}'s only value {key!r} is {_shown(numbers[key])}, not a finite number"
        rewards["reward"] = rewards[key]
    else:
        return {}, f'{REWARD_JSON} has no "reward" (and no usable {REWARD_TXT})'
    return rewards, None


def finite(value: int | float) -> float | None:
    """A JSON number as a float, None for one no float holds (NaN, infinity, an integer past 1.8e308)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _shown(value) -> str:
    text = (
        json.dumps(value) if not isinstance(value, int) or abs(value) < 10**30 else f"a {len(str(value))}-digit integer"
    )
    return text if len(text) <= 40 else text[:37] + "..."


def _read(sandbox: Sandbox, path: str) -> tuple[str | None, str | None]:
    """A reward file's text (None if there is none), or why it cannot be read."""
    try:
        data = sandbox.read_file(path, limit=MAX_REWARD_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None, None
    except OSError as e:
        return None, f"{path} cannot be read ({e})"
    if len(data) > MAX_REWARD_BYTES:
        return None, f"{path} is over {MAX_REWARD_BYTES} bytes"
    return data.decode("utf-8", "replace"), None


def _text_reward(text: str) -> tuple[float | None, str | None]:
    try:
        value = float(text.strip())
    except ValueError:
        return None, f"{REWARD_TXT} holds {text.strip()[:40]!r}, not a number"
    if not math.isfinite(value):
        return None, f"{REWARD_TXT} holds {text.strip()[:40]!r}, not a finite number"
    return value, None
