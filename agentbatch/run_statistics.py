"""Run statistics (statistics.json and the printed summary), computed from the files themselves so they always agree with them."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentbatch.outcome_stats import format_outcomes
from agentbatch.tools.registry import ALL_TOOL_NAMES
from trajectory import reasoning_counts

_TOKEN_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def _zero_tokens() -> dict[str, int]:
    return dict.fromkeys(_TOKEN_KEYS, 0)


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
    discarded: int = 0
    discard_reasons: dict[str, int] = field(default_factory=dict)
    tokens_kept: dict[str, int] = field(default_factory=_zero_tokens)
    tokens_discarded: dict[str, int] = field(default_factory=_zero_tokens)
    tokens_failed: dict[str, int] = field(default_factory=_zero_tokens)

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

    def add_discarded(self, line: dict) -> None:
        self.discarded += 1
        reason = line.get("discard_reason") or "unknown"
        self.discard_reasons[reason] = self.discard_reasons.get(reason, 0) + 1
        _add_tokens(self.tokens_discarded, line.get("usage"))

    def add_failed_attempt(self, line: dict) -> None:
        _add_tokens(self.tokens_failed, line.get("usage"))

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
        return {
            **extra,
            "trajectories": self.trajectories,
            "completed": self.completed,
            "partial": self.partial,
            "max_turns_reached": self.max_turns_reached,
            "stop_reasons": self.stop_reasons,
            "api_calls": self.api_calls,
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
        }


def _add_tokens(into: dict[str, int], usage: dict | None) -> None:
    for k in _TOKEN_KEYS:
        into[k] += int((usage or {}).get(k) or 0)


def format_summary(stats: dict) -> str:
    """The printed end-of-run summary."""
    samples = (stats.get("outcomes") or {}).get("samples_per_prompt") or 1
    total = stats["prompts"]["total"]
    what = f"{total // samples} prompts × {samples} samples" if samples > 1 else f"{total} prompts"
    lines = [
        "",
        f"Run {stats.get('run_name')}: {what} in the dataset",
        f"  done {stats['prompts']['done']}  (completed {stats['completed']}, partial {stats['partial']}, "
        f"max turns reached {stats['max_turns_reached']})",
        f"  discarded {stats['discarded']}  {stats['discard_reasons'] or ''}".rstrip(),
        f"  failed {stats['prompts']['failed']}  not run {stats['prompts']['not_run']}",
        f"  merge: {stats['merge']['kept']} lines kept, {stats['merge']['filtered_unknown_tool']} filtered for "
        f"unknown tools, {stats['merge']['filtered_not_json']} not JSON",
    ]
    r = stats["reasoning"]
    cov = f"{r['coverage']:.1%}" if r["coverage"] is not None else "n/a"
    lines.append(f"  reasoning: {r['with_reasoning']} of {r['assistant_turns']} assistant turns ({cov})")
    t = stats["tokens"]["total"]
    lines.append(
        f"  tokens: {t['total_tokens']} ({t['prompt_tokens']} prompt, {t['completion_tokens']} completion); "
        f"duration {stats['duration_seconds']:.1f} s"
    )
    lines += format_outcomes(stats.get("outcomes"))
    used = {n: s for n, s in stats["tools"].items() if s["count"]}
    if used:
        lines.append(f"  {'tool':<20}{'calls':>8}{'ok':>8}{'failed':>8}{'rate':>8}")
        for name, s in sorted(used.items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"  {name:<20}{s['count']:>8}{s['success']:>8}{s['failure']:>8}{s['success_rate']:>8.0%}")
    return "\n".join(lines)
