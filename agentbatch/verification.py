"""A row's setup and check, run in the sample's own sandbox (docs/verified-outcomes.md).

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
from dataclasses import dataclass, field
from decimal import Decimal

from agentbatch.sandboxes.base import SandboxError
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import cap_output

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
    rewards: dict[str, float] | None = None  # named rewards, when a format's check gives some (harbor/verifier.py)
    # Files the check keeps of the sample (a task's artifacts): (path, bytes), written by the runner into the run
    # directory's artifacts/ folder for the sample (run_dir/paths.py), never into the line.
    files: list[tuple[str, bytes]] = field(default_factory=list, repr=False)

    def fields(self) -> dict:
        """The trajectory line's `reward`, `passed` and `check` (every key always present).

        `check.rewards` is a list of {"name", "value"} pairs, "reward" first: one shape for every line, whatever
        names each task's rewards have (a struct per line with its own keys is a schema per task to `datasets`).
        """
        return {
            "reward": self.reward,
            "passed": self.passed,
            "check": {
                "status": self.status,
                "exit_code": self.exit_code,
                "output": self.output,
                "seconds": round(float(self.seconds), 3),
                "answer_matched": self.answer_matched,
                "rewards": named_rewards(self.rewards),
            },
        }


def named_rewards(rewards: dict[str, float] | None) -> list[dict] | None:
    """Named rewards as the line keeps them: [{"name": "reward", "value": 1.0}, ...], "reward" first."""
    if rewards is None:
        return None
    names = sorted(rewards, key=lambda k: k != "reward")  # stable: the file's order after "reward"
    return [{"name": k, "value": float(rewards[k])} for k in names]


def run_setup(ctx: ToolContext, command: str, timeout: float) -> None:
    """Run the row's setup in the sample's sandbox (made now if need be); SetupFailed unless it exits 0."""
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
    """The reward a check printed on its last non-empty line: a JSON number, or an object's numeric "reward".

    A value no float holds (NaN, infinity, an integer past 1.8e308) is no reward: the exit status decides.
    """
    lines = [line for line in output.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except (ValueError, RecursionError):  # ValueError also covers integers past Python's digit limit
        return None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        reward = float(value)
    except OverflowError:
        return None
    return reward if math.isfinite(reward) else None


def _normalise(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


# A number as written: a sign unless it follows a letter or digit (then it is a hyphen, a range or a
# subtraction), digits with points and commas between them, taken whole (atomic) so that 391.5 or 391,000
# is never read as 391. Which of those runs are one number is _number's business.
_NUMBER_RUN = re.compile(r"(?<![\w.,])(?:(?<!\w)[-+\u2212])?(?>\.?\d(?:[.,]?\d)*)(?!\w)")
_NUMBER = re.compile(r"([-+\u2212]?)(\d{1,3}(?:,\d{3})+|\d+)?(?:\.(\d+))?")
# A word right before an occurrence that says it is not the answer: "not 391, it is 392", "Paris, not Lyon".
_NEGATED = re.compile(r"(?<!\w)(?:not|\w+n['\u2019]t)\W{0,2}$")


def _number(text: str) -> Decimal | None:
    """The value of a whole number as written (sign, comma-grouped digits, decimals), else None."""
    m = _NUMBER.fullmatch(text)
    if not m or not (m.group(2) or m.group(3)):
        return None
    sign = "-" if m.group(1) in ("-", "\u2212") else ""
    return Decimal(f"{sign}{(m.group(2) or '0').replace(',', '')}.{m.group(3) or '0'}")


def _negated(message: str, start: int) -> bool:
    return _NEGATED.search(message, max(0, start - 40), start) is not None


def answer_matches(expected: str, message: str) -> bool:
    """The expected answer occurs in the message, whole and not right after "not" (docs/verified-outcomes.md).

    A number matches a number of the same value written whole: "391" matches "17*23 = 391." and "391.0", not
    "-391", "391.5", "3.391", "391,000" or "not 391". Other answers match as a whole word or phrase, ignoring
    case and spacing: "Paris" matches "The capital is PARIS", not "Parisian".
    """
    wanted = _normalise(expected)
    if not wanted:
        return False
    text = _normalise(message)
    value = _number(wanted)
    if value is not None:
        return any(_number(m.group()) == value and not _negated(text, m.start()) for m in _NUMBER_RUN.finditer(text))
    # A phrase that starts or ends with a digit must not start or end inside a longer number.
    before = r"(?<![\w.,])(?<!(?<!\w)[-+\u2212])" if wanted[0].isdigit() else r"(?<!\w)"
    after = r"(?![.,]?\d)(?!\w)" if wanted[-1].isdigit() else r"(?!\w)"
    pattern = re.compile(before + re.escape(wanted) + after)
    return any(not _negated(text, m.start()) for m in pattern.finditer(text))


def last_message(messages: list[dict]) -> str:
    """The content of the agent's last assistant message (its reasoning left out); "" if it never answered."""
    for m in reversed(messages):
        if m.get("role") == "assistant":
            return m.get("content") or ""
    return ""


def _tail(output: str, limit: int = 300) -> str:
    text = " ".join(output.split())
    return (text[-limit:] if len(text) > limit else text) or "(no output)"
