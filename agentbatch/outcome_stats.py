"""Statistics of verified outcomes (statistics.json "outcomes"): pass rate, mean reward, pass@k, tokens per pass.

Computed over every sample with a check, kept or discarded (a --require_pass run discards its failures,
and they count). A check that gave no result (timed out, or could not run) is a sample checked and not
passed, with reward 0, as in Harbor: an agent that breaks its check gains nothing by it. Samples are
grouped into prompts by (prompt_index, row identity; the prompt text on lines written before identities)
for pass@k, overall, per toolset (all samples of a prompt are offered the same toolsets), and per category
and difficulty of a Harbor task (the line's `task`; "none" for a task without one, so that each breakdown
adds up to the whole).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from agentbatch.terminal_text import safe
from trajectory import first_human

NO_RESULT = ("timeout", "error")  # check statuses of a check that could not give a result
NO_VALUE = "none"  # the category (or difficulty) of a Harbor task that has none


# Rewards are summed scaled down by 2**64 (a power of two: exact for every reward a float holds above 1e-289), so
# that a sum of large finite rewards stays finite and their mean, which is never larger, is written as a
# number: two rewards of 1e308 summed as they are make Infinity, which statistics.json cannot hold as JSON.
REWARD_UNIT = 2.0**-64


@dataclass(slots=True)
class _Group:
    """One checked prompt: its toolsets, and counts over its samples (small: one per prompt of a big run)."""

    toolsets: tuple[str, ...]
    task: tuple[str | None, str | None] = (None, None)  # a Harbor task's (category, difficulty)
    n: int = 0  # samples checked, with a result or not
    c: int = 0  # of which passed
    reward_sum: float = 0.0  # each reward times REWARD_UNIT
    rewards: int = 0
    tokens: int = 0
    timeout: int = 0
    error: int = 0


class OutcomeStats:
    """Accumulates trajectory and discard lines, then reports outcome statistics."""

    def __init__(self):
        self._groups: dict[int, _Group] = {}
        self._unchecked: dict[tuple[str, ...], int] = defaultdict(int)  # samples without a check, by toolsets
        self._unchecked_tasks: dict[tuple, int] = defaultdict(int)  # and by (category, difficulty)

    def add(self, record: dict) -> None:
        toolsets = tuple(record.get("toolsets_used") or ())
        check = record.get("check") if isinstance(record.get("check"), dict) else {}
        status = check.get("status")
        task = _task(record)
        if status not in ("passed", "failed", *NO_RESULT):  # no check, or a line from before checks
            self._unchecked[toolsets] += 1
            self._unchecked_tasks[task] += 1
            return
        # One int per prompt, not its text: (index, row identity) hashed (one process, so one hash seed); lines
        # written before identities by their prompt text.
        identity = record.get("identity")
        row = identity if type(identity) is str and identity else first_human(record)
        key = hash((record.get("prompt_index"), row))
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(toolsets, task)
        group.n += 1
        group.tokens += int((record.get("usage") or {}).get("total_tokens") or 0)
        if status in NO_RESULT:  # not passed, reward 0
            setattr(group, status, getattr(group, status) + 1)
            group.rewards += 1
            return
        group.c += record.get("passed") is True
        reward = record.get("reward")
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            group.reward_sum += reward * REWARD_UNIT
            group.rewards += 1

    def to_dict(self, samples_per_prompt: int) -> dict:
        """The "outcomes" section: the figures over every sample, and the same per toolset of checked prompts."""
        groups = list(self._groups.values())
        toolsets = sorted({t for g in groups for t in g.toolsets})
        unchecked = {t: sum(n for ts, n in self._unchecked.items() if t in ts) for t in toolsets}
        return {
            "samples_per_prompt": samples_per_prompt,
            **_figures(groups, sum(self._unchecked.values())),
            "by_toolset": {t: _figures([g for g in groups if t in g.toolsets], unchecked[t]) for t in toolsets},
            "by_category": self._by_task(groups, 0),
            "by_difficulty": self._by_task(groups, 1),
        }

    def _by_task(self, groups: list[_Group], part: int) -> dict:
        """The figures per value of a Harbor task's category (part 0) or difficulty (1), "none" for a task without
        one; {} without tasks."""
        values = sorted(({g.task[part] for g in groups} | {t[part] for t in self._unchecked_tasks}) - {None})
        return {
            v: _figures(
                [g for g in groups if g.task[part] == v],
                sum(n for t, n in self._unchecked_tasks.items() if t[part] == v),
            )
            for v in values
        }


def _task(record: dict) -> tuple[str | None, str | None]:
    """A line's Harbor task (category, difficulty), NO_VALUE where it has none; (None, None) for a JSONL row's."""
    task = record.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("name"), str):
        return None, None
    return tuple(v if isinstance(v, str) and v else NO_VALUE for v in (task.get("category"), task.get("difficulty")))


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n samples of which c passed: 1 - C(n-c, k) / C(n, k).

    Written as a product, which stays exact in floating point where the binomials would overflow.
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _figures(groups: list[_Group], unchecked: int) -> dict:
    checked = [g for g in groups if g.n]
    n = sum(g.n for g in checked)
    passes = sum(g.c for g in checked)
    rewards = sum(g.rewards for g in checked)
    ks = range(1, max((g.n for g in checked), default=0) + 1)
    at_k = {k: [pass_at_k(g.n, g.c, k) for g in checked if g.n >= k] for k in ks}
    timeout, error = sum(g.timeout for g in groups), sum(g.error for g in groups)
    return {
        "checked": n,
        "passed": passes,
        "not_passed": n - passes - timeout - error,  # checks that gave a result other than a pass
        "failed": n - passes - timeout - error,  # `not_passed`'s old name, kept one release (docs/output.md)
        "timeout": timeout,
        "error": error,
        "unchecked": unchecked,
        "pass_rate": round(passes / n, 4) if n else None,
        "mean_reward": round(sum(g.reward_sum for g in checked) / rewards / REWARD_UNIT, 4) if rewards else None,
        "prompts_checked": len(checked),
        "pass_at_k": {str(k): round(sum(v) / len(v), 4) for k, v in at_k.items()},
        "pass_at_k_prompts": {str(k): len(v) for k, v in at_k.items()},
        "tokens_per_pass": round(sum(g.tokens for g in checked) / passes, 1) if passes else None,
    }


def shown_ks(pass_at: dict[str, float]) -> list[str]:
    """The k of the printed summary: 1, powers of two, and the largest."""
    ks = sorted(int(k) for k in pass_at)
    return [str(k) for k in ks if k & (k - 1) == 0 or k == ks[-1]]


def format_outcomes(outcomes: dict | None) -> list[str]:
    """Summary lines about checks; none when no sample had a check."""
    if not outcomes or not (outcomes["checked"] or outcomes["timeout"] or outcomes["error"]):
        return []
    o = outcomes
    rate = f"{o['pass_rate']:.1%}" if o["pass_rate"] is not None else "n/a"
    reward = f"{o['mean_reward']:.3f}" if o["mean_reward"] is not None else "n/a"
    lines = [
        f"  checks: {o['passed']} passed, {o['not_passed']} not passed, {o['timeout']} timed out, {o['error']} could not run, "
        f"{o['unchecked']} without a check; pass rate {rate}, mean reward {reward}"
    ]
    ks = shown_ks(o["pass_at_k"])
    if ks:
        at_k = "  ".join(f"pass@{k} {o['pass_at_k'][k]:.3f}" for k in ks)
        per_pass = f"{o['tokens_per_pass']:.0f}" if o["tokens_per_pass"] is not None else "n/a"
        lines.append(f"  {at_k}  over {o['prompts_checked']} prompts; tokens per passing sample {per_pass}")
    for title, key in (("toolset", "by_toolset"), ("category", "by_category"), ("difficulty", "by_difficulty")):
        lines += _table(title, o.get(key) or {}, ks)
    return lines


def _table(title: str, figures: dict, ks: list[str]) -> list[str]:
    """The summary's table of one grouping (toolset, category, difficulty): its groups with a checked sample."""
    rows = {safe(t): f for t, f in figures.items() if f["checked"]}  # a category is a task set's own text
    if not rows or not ks:
        return []
    width = max(12, max(len(t) for t in rows) + 2)
    head = "".join(f"{'pass@' + k:>9}" for k in ks)
    lines = [f"  {title:<{width}}{'checked':>8}{'passed':>8}{'rate':>8}{'reward':>8}{head}"]
    for t, f in rows.items():
        cells = "".join(f"{f['pass_at_k'][k]:>9.3f}" if k in f["pass_at_k"] else f"{'-':>9}" for k in ks)
        mean = f"{f['mean_reward']:>8.3f}" if f["mean_reward"] is not None else f"{'-':>8}"
        lines.append(f"  {t:<{width}}{f['checked']:>8}{f['passed']:>8}{f['pass_rate']:>8.0%}{mean}{cells}")
    return lines
