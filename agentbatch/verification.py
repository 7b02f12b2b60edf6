"""A row's setup and check, run in the prompt's own sandbox (README, "Verified outcomes").

`setup` runs before the agent's first model call; `verify` runs after its last one, in the same sandbox,
through the same `Sandbox.exec` as the agent's own commands (so the same isolation and environment), before
the sandbox is removed. `answer` is compared with the agent's last message. The result is a `CheckResult`
whose `fields()` are the trajectory line's `reward`, `passed` and `check`.
"""

from __future__ import annotations

import json
import math
import re
import time
import unicodedata
from dataclasses import dataclass

from agentbatch.sandboxes.base import SandboxError
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import cap_output

# check.status, one value per way a check can end: no check, a result (passed, failed), or no result.
CHECK_STATUSES = ("none", "passed", "failed", "timeout", "error")
MAX_CHECK_OUTPUT = 4000  # characters of the verify command's output kept in the trajectory (head and tail)


class SetupFailed(SandboxError):
    """The row's setup command failed: the task's environment is not there, so the agent is never started."""


@dataclass
class CheckResult:
    """How a sample's check went; reward and passed are None when there was no check or it could not run."""

    status: str = "none"
    reward: float | None = None
    passed: bool | None = None
    exit_code: int | None = None
    output: str = ""
    seconds: float = 0.0
    answer_matched: bool | None = None
    rewards: dict[str, float] | None = None  # a Harbor task's named rewards (harbor/verifier.py)

    def fields(self) -> dict:
        """The trajectory line's `reward`, `passed` and `check` (every key always present)."""
        return {
            "reward": self.reward,
            "passed": self.passed,
            "check": {
                "status": self.status,
                "exit_code": self.exit_code,
                "output": self.output,
                "seconds": round(float(self.seconds), 3),
                "answer_matched": self.answer_matched,
                "rewards": self.rewards,
            },
        }


def run_setup(ctx: ToolContext, command: str, timeout: float) -> None:
    """Run the row's setup in the prompt's sandbox (made now if need be); SetupFailed unless it exits 0."""
    result = ctx.sandbox().exec(command, timeout=timeout)
    if result.timed_out:
        raise SetupFailed(f"setup timed out after {timeout:g} s (--check_timeout): {_tail(result.output)}")
    if result.exit_code != 0:
        raise SetupFailed(f"setup failed with exit code {result.exit_code}: {_tail(result.output)}")


def run_check(
    ctx: ToolContext, verify: str | None, answers: tuple[str, ...], last_message: str, timeout: float
) -> CheckResult:
    """Check one sample: its verify command in its sandbox, its last message against the expected answers."""
    if not verify and not answers:
        return CheckResult()
    start = time.monotonic()
    matched = any(answer_matches(a, last_message) for a in answers) if answers else None
    if not verify:
        result = CheckResult(reward=float(bool(matched)), passed=bool(matched), answer_matched=matched)
    else:
        result = _verify(ctx, verify, timeout)
        result.answer_matched = matched
        if result.passed is not None and matched is False:
            result.passed, result.reward = False, 0.0
    if result.passed is not None:
        result.status = "passed" if result.passed else "failed"
    result.seconds = time.monotonic() - start
    return result


def _verify(ctx: ToolContext, command: str, timeout: float) -> CheckResult:
    try:
        done = ctx.sandbox().exec(command, timeout=timeout)
    except (SandboxError, OSError) as e:  # no sandbox to check in: the engine refused, the container is gone
        return CheckResult(status="error", output=cap_output(f"the check could not run: {e}", MAX_CHECK_OUTPUT))
    output = cap_output(done.output, MAX_CHECK_OUTPUT)
    if done.timed_out:
        return CheckResult(status="timeout", output=output)
    reward = parse_reward(done.output)
    if reward is None:
        reward = 1.0 if done.exit_code == 0 else 0.0
    # A reward below full marks is partial credit, not a pass: pass rates and pass@k count full passes only.
    passed = done.exit_code == 0 and reward >= 1.0
    return CheckResult(reward=reward, passed=passed, exit_code=done.exit_code, output=output)


def parse_reward(output: str) -> float | None:
    """The reward a check printed on its last non-empty line: a JSON number, or an object's numeric "reward"."""
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except (ValueError, RecursionError):
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def answer_matches(expected: str, message: str) -> bool:
    """The expected answer occurs in the message as a whole word or phrase, ignoring case and spacing.

    "391" matches "17*23 = 391." but not "3910"; "Paris" matches "The capital is PARIS".
    """
    wanted = _normalise(expected)
    if not wanted:
        return False
    return re.search(rf"(?<!\w){re.escape(wanted)}(?!\w)", _normalise(message)) is not None


def last_message(messages: list[dict]) -> str:
    """The content of the agent's last assistant message (its reasoning left out); "" if it never answered."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return ""


def _tail(output: str, limit: int = 300) -> str:
    text = " ".join(output.split())
    return (text[-limit:] if len(text) > limit else text) or "(no output)"
