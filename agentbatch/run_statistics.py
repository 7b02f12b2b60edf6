"""Run statistics (statistics.json and the printed summary), computed from the files themselves so they always agree with them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from agentbatch.model.usage import COST_DIGITS, cost_of
from agentbatch.outcome_stats import OutcomeStats, format_outcomes
from agentbatch.run_dir import answers
from agentbatch.run_dir.lines import ReadCounts
from agentbatch.run_dir.spend import Spend
from agentbatch.tools.registry import ALL_TOOL_NAMES
from trajectory import STOP_REASONS, reasoning_counts

if TYPE_CHECKING:
    from agentbatch.dataset import Entry
    from agentbatch.run_dir.reader import RunReader

_TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _zero_tokens() -> dict[str, int]:
    return dict.fromkeys(_TOKEN_KEYS, 0)


def _money(value: float) -> float:
    return round(value, COST_DIGITS)


def _per(total: float, count: int) -> float | None:
    return _money(total / count) if count else None


@dataclass
class Group:
    """What the lines of one model, or one toolset, came to: counts, tokens and cost."""

    trajectories: int = 0
    completed: int = 0
    passing: int = 0
    discarded: int = 0
    failed_attempts: int = 0
    spend: Spend = field(default_factory=Spend)

    def add(self, line: dict, kind: str) -> None:
        if kind == "trajectory":
            self.trajectories += 1
            self.completed += bool(line.get("completed"))
            self.passing += line.get("passed") is True
        elif kind == "discarded":
            self.discarded += 1
        else:
            self.failed_attempts += 1
        self.spend.add(line.get("usage"))

    def to_dict(self, rewards: bool) -> dict:
        cost = self.spend.cost
        return {
            "trajectories": self.trajectories,
            "completed": self.completed,
            "discarded": self.discarded,
            "failed_attempts": self.failed_attempts,
            "tokens": self.spend.tokens,
            "cost": _money(cost),
            "cost_per_completed": _per(cost, self.completed),
            "cost_per_passing": _per(cost, self.passing) if rewards else None,
        }


@dataclass
class RunStats:
    """Accumulates statistics over trajectories, discards and failures."""

    tools: dict[str, dict[str, int]] = field(
        default_factory=lambda: {n: {"count": 0, "success": 0, "failure": 0} for n in ALL_TOOL_NAMES}
    )
    turns_with_reasoning: int = 0
    turns_without_reasoning: int = 0
    trajectories: int = 0
    completed: int = 0
    partial: int = 0
    max_turns_reached: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)
    api_calls: int = 0
    cached_calls: int = 0  # of the api_calls, those the model-call cache answered (--cache)
    discarded: int = 0
    discard_reasons: dict[str, int] = field(default_factory=dict)
    tokens_kept: dict[str, int] = field(default_factory=_zero_tokens)
    tokens_discarded: dict[str, int] = field(default_factory=_zero_tokens)
    tokens_failed: dict[str, int] = field(default_factory=_zero_tokens)
    cost_kept: float = 0.0
    cost_discarded: float = 0.0
    cost_failed: float = 0.0
    passing: int = 0
    rewards: bool = False  # some line says whether it passed (a run with rewards)
    by_model: dict[str, Group] = field(default_factory=dict)
    by_toolset: dict[str, Group] = field(default_factory=dict)

    def _group(self, line: dict, kind: str, model) -> None:
        """Count the line under its model and under each toolset it was offered (so toolsets overlap)."""
        key = model if isinstance(model, str) else "unknown"
        self.by_model.setdefault(key, Group()).add(line, kind)
        toolsets = line.get("toolsets_used")  # a failed attempt's line is any object (record_shape): a list or none
        for toolset in toolsets if type(toolsets) is list else ():
            if isinstance(toolset, str):
                self.by_toolset.setdefault(toolset, Group()).add(line, kind)

    def add_trajectory(self, record: dict) -> None:
        self.trajectories += 1
        if record.get("completed"):
            self.completed += 1
        elif record.get("partial"):
            self.partial += 1
        else:
            self.max_turns_reached += 1
        reason = record.get("stop_reason")
        if isinstance(reason, str):
            self.stop_reasons[reason] = self.stop_reasons.get(reason, 0) + 1
        self.api_calls += int(record.get("api_calls") or 0)
        cached = (record.get("usage") or {}).get("cached_calls")
        self.cached_calls += cached if type(cached) is int and cached > 0 else 0
        for name, s in (record.get("tool_stats") or {}).items():
            if not s.get("count"):
                continue  # most tools are unused in most lines: skipping them is most of the merge's speed
            t = self.tools.get(name)
            if t is None:
                t = self.tools[name] = {"count": 0, "success": 0, "failure": 0}
            t["count"] += int(s["count"])
            t["success"] += int(s.get("success", 0))
            t["failure"] += int(s.get("failure", 0))
        with_r, without_r = reasoning_counts(record.get("conversations") or [])
        self.turns_with_reasoning += with_r
        self.turns_without_reasoning += without_r
        _add_tokens(self.tokens_kept, record.get("usage"))
        self.cost_kept += cost_of(record.get("usage"))
        if record.get("passed") is not None:  # checked (a line without a check has passed null)
            self.rewards = True
            self.passing += record["passed"] is True
        self._group(record, "trajectory", (record.get("metadata") or {}).get("model"))

    def add_discarded(self, line: dict) -> None:
        self.discarded += 1
        reason = line.get("discard_reason")
        reason = reason if isinstance(reason, str) and reason else "unknown"
        self.discard_reasons[reason] = self.discard_reasons.get(reason, 0) + 1
        _add_tokens(self.tokens_discarded, line.get("usage"))
        self.cost_discarded += cost_of(line.get("usage"))
        self._group(line, "discarded", (line.get("metadata") or {}).get("model"))

    def add_failed_attempt(self, line: dict) -> None:
        _add_tokens(self.tokens_failed, line.get("usage"))
        self.cost_failed += cost_of(line.get("usage"))
        self._group(line, "failed", line.get("model"))

    def count_failed_samples(self, n: int) -> None:
        """Samples whose last attempt failed: the `error` way a sample ends, beside the trajectories' reasons."""
        if n:
            self.stop_reasons["error"] = n

    def to_dict(self, **extra) -> dict:
        """The statistics.json document."""
        tools = {
            name: dict(s, success_rate=round(s["success"] / s["count"], 4) if s["count"] else None)
            for name, s in self.tools.items()
        }
        turns = self.turns_with_reasoning + self.turns_without_reasoning
        total_tokens = _zero_tokens()
        for part in (self.tokens_kept, self.tokens_discarded, self.tokens_failed):
            _add_tokens(total_tokens, part)
        total_cost = self.cost_kept + self.cost_discarded + self.cost_failed
        return {
            **extra,
            "trajectories": self.trajectories,
            "completed": self.completed,
            "partial": self.partial,
            "max_turns_reached": self.max_turns_reached,
            # In the one order of STOP_REASONS: lines are counted as they finish, in no fixed order.
            "stop_reasons": {
                **{k: self.stop_reasons[k] for k in STOP_REASONS if k in self.stop_reasons},
                **{k: v for k, v in self.stop_reasons.items() if k not in STOP_REASONS},
            },
            "api_calls": self.api_calls,
            "cached_calls": self.cached_calls,
            "discarded": self.discarded,
            "discard_reasons": self.discard_reasons,
            "reasoning": {
                "assistant_turns": turns,
                "with_reasoning": self.turns_with_reasoning,
                "without_reasoning": self.turns_without_reasoning,
                "coverage": round(self.turns_with_reasoning / turns, 4) if turns else None,
            },
            "tools": tools,
            "tokens": {
                "trajectories": self.tokens_kept,
                "discarded": self.tokens_discarded,
                "failed_attempts": self.tokens_failed,
                "total": total_tokens,
            },
            "cost": {
                "trajectories": _money(self.cost_kept),
                "discarded": _money(self.cost_discarded),
                "failed_attempts": _money(self.cost_failed),
                "total": _money(total_cost),
                "per_completed": _per(total_cost, self.completed),
                "per_passing": _per(total_cost, self.passing) if self.rewards else None,
            },
            "by_model": {k: g.to_dict(self.rewards) for k, g in sorted(self.by_model.items())},
            "by_toolset": {k: g.to_dict(self.rewards) for k, g in sorted(self.by_toolset.items())},
        }


class Tally:
    """statistics.json in the making: this session's trajectories counted as they are written (add_trajectory),
    everything else read from the files at the end (document)."""

    def __init__(self, tool_names: tuple[str, ...] = ALL_TOOL_NAMES):
        # Every tool of the run (tool_set.py) is in statistics.json's "tools", called or not.
        self.stats = RunStats(tools={n: {"count": 0, "success": 0, "failure": 0} for n in tool_names})
        self.outcomes = OutcomeStats()
        self.kept: Counter = Counter()  # row and sample (run_dir/answers.py) → trajectories answering it

    def add_trajectory(self, record: dict) -> None:
        self.stats.add_trajectory(record)
        self.outcomes.add(record)
        answers.count(record, self.kept)

    def document(self, reader: RunReader, entries: list[Entry], samples: int, merged: ReadCounts, run: dict) -> dict:
        """The statistics.json document, once every trajectory went through add_trajectory (the merge's), the
        discards and failed attempts read here (run_dir's reader: the lines that count).

        `run` is what it says of the run itself: run_name, model, distribution, duration_seconds, updated_at.
        """
        stats, discarded, failed = self.stats, Counter(), Counter()
        for line in reader.discards():
            stats.add_discarded(line.record)
            self.outcomes.add(line.record)
            answers.count(line.record, discarded)
        for line in reader.failures():
            stats.add_failed_attempt(line.record)
            answers.count(line.record, failed)
        by_end = answers.last_words(entries, samples, self.kept, discarded, failed)
        stats.count_failed_samples(by_end["failed"])
        doc = stats.to_dict(
            run_name=run["run_name"],
            model=run["model"],
            distribution=run["distribution"],
            samples=by_end,
            prompts=dict(by_end),  # `samples`' old name, kept one release for its readers (docs/output.md)
            merge=merge_counts(merged),
            duration_seconds=run["duration_seconds"],
            updated_at=run["updated_at"],
        )
        doc["outcomes"] = self.outcomes.to_dict(samples)
        return doc


def merge_counts(counts: ReadCounts) -> dict[str, int]:
    """statistics.json's `merge`: the batch files' lines the merge kept, and those it left out by why."""
    return {
        "kept": counts.trajectories,
        "filtered_unknown_tool": counts.unknown_tool,
        "filtered_not_json": counts.not_json,
        "filtered_malformed": counts.malformed,
    }


def _add_tokens(into: dict[str, int], usage: object) -> None:
    """Add a line's token counts; a usage of another shape (a hand-edited or foreign line) adds nothing."""
    if not isinstance(usage, dict):
        return
    for k in _TOKEN_KEYS:
        value = usage.get(k)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            into[k] += value


def format_summary(stats: dict) -> str:
    """The printed end-of-run summary."""
    samples = (stats.get("outcomes") or {}).get("samples_per_prompt") or 1
    total = stats["samples"]["total"]
    what = f"{total // samples} prompts × {samples} samples" if samples > 1 else f"{total} prompts"
    lines = [
        "",
        f"Run {stats.get('run_name')}: {what} in the dataset",
        f"  done {stats['samples']['done']}  (completed {stats['completed']}, partial {stats['partial']}, "
        f"max turns reached {stats['max_turns_reached']})",
        f"  discarded {stats['discarded']}  {stats['discard_reasons'] or ''}".rstrip(),
        f"  failed {stats['samples']['failed']}  not run {stats['samples']['not_run']}",
        f"  merge: {stats['merge']['kept']} lines kept, {stats['merge']['filtered_unknown_tool']} filtered for "
        f"unknown tools, {stats['merge']['filtered_not_json']} not JSON, "
        f"{stats['merge'].get('filtered_malformed', 0)} not trajectories",
    ]
    r = stats["reasoning"]
    cov = f"{r['coverage']:.1%}" if r["coverage"] is not None else "n/a"
    lines.append(f"  reasoning: {r['with_reasoning']} of {r['assistant_turns']} assistant turns ({cov})")
    t = stats["tokens"]["total"]
    lines.append(
        f"  tokens: {t['total_tokens']} ({t['prompt_tokens']} prompt, {t['completion_tokens']} completion); "
        f"duration {stats['duration_seconds']:.1f} s"
    )
    if stats.get("cached_calls"):
        lines.append(f"  model calls answered by the cache: {stats['cached_calls']} of {stats['api_calls']}")
    c = stats["cost"]
    if c["total"]:
        per = f"; ${c['per_completed']:.4f} per completed trajectory" if c["per_completed"] is not None else ""
        lines.append(
            f"  cost: ${c['total']:.4f} (trajectories ${c['trajectories']:.4f}, discarded ${c['discarded']:.4f}, "
            f"failed attempts ${c['failed_attempts']:.4f}){per}"
        )
    lines += format_outcomes(stats.get("outcomes"))
    used = {n: s for n, s in stats["tools"].items() if s["count"]}
    if used:
        lines.append(f"  {'tool':<20}{'calls':>8}{'ok':>8}{'failed':>8}{'rate':>8}")
        for name, s in sorted(used.items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"  {name:<20}{s['count']:>8}{s['success']:>8}{s['failure']:>8}{s['success_rate']:>8.0%}")
    return "\n".join(lines)
