"""A run's figures for the report: statistics.json's own (run_statistics, outcome_stats, fed the same lines), and
what the report adds: outcomes by task category, reward histograms, distributions of tokens, cost and duration
with the costliest and slowest, the common error texts of each tool, and the failed attempts by error."""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict

from agentbatch.model.usage import cost_of
from agentbatch.outcome_stats import OutcomeStats
from agentbatch.run_dir.answers import answer_key
from agentbatch.run_dir.lines import ReadCounts
from agentbatch.run_dir.reader import Line
from agentbatch.run_statistics import RunStats, merge_counts
from toolset_distributions import ALL_TOOL_NAMES

# Where a row's task category lives: these keys of a line's `metadata`, or of an object inside it
# (a Harbor task's metadata: issue 27).
CATEGORY_FIELDS = ("category", "difficulty")
TOP = 10  # the costliest and the slowest listed
ERROR_TEXTS = 5  # the most common error texts shown per tool
TEXT = 200  # characters of an error text kept


def categories(record: dict) -> list[tuple[str, str]]:
    """(field, value) of each task category the line's metadata names."""
    meta = record.get("metadata")
    if not isinstance(meta, dict):
        return []
    found: list[tuple[str, str]] = []
    for scope in (meta, *(v for v in meta.values() if isinstance(v, dict))):
        for name in CATEGORY_FIELDS:
            value = scope.get(name)
            if isinstance(value, str | int | float) and not isinstance(value, bool) and str(value):
                if (name, str(value)) not in found:
                    found.append((name, str(value)))
    return found


def seconds_of(record: dict) -> float | None:
    """How long the sample took, where its line records it (`duration_seconds`, at the top or in `metadata`)."""
    for scope in (record, record.get("metadata")):
        value = scope.get("duration_seconds") if isinstance(scope, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def tokens_of(record: dict) -> int:
    usage = record.get("usage")
    value = usage.get("total_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def one_line(text: object, limit: int = TEXT) -> str:
    """An error text as one line of at most `limit` characters."""
    words = " ".join(str(text).split())
    return words if len(words) <= limit else words[: limit - 1] + "…"


def tool_error(value: str) -> str | None:
    """The error a tool result reports (a JSON object with a non-empty `error`), else None."""
    if '"error"' not in value:
        return None
    if '"error": null' in value and value.count('"error"') == 1:  # most results: no need to parse them
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if isinstance(parsed, dict) and parsed.get("error"):
        error = parsed["error"]
        return one_line(error if isinstance(error, str) else json.dumps(error))
    return None


class Figures:
    """Accumulates one run's lines; to_dict() gives every figure the report draws."""

    def __init__(self, tool_names: tuple[str, ...] = ALL_TOOL_NAMES):
        # The run's tools (tools.json), each in the figures called or not, as statistics.json has them.
        self.stats = RunStats(tools={n: {"count": 0, "success": 0, "failure": 0} for n in tool_names})
        self.outcomes = OutcomeStats()
        self.by_category: dict[tuple[str, str], OutcomeStats] = {}
        self.rewards: list[tuple[float, tuple[str, ...], tuple[tuple[str, str], ...]]] = []
        self.usage: list[tuple[int, int, float, float | None, int]] = []  # item, tokens, cost, seconds, calls
        self.tool_errors: dict[str, Counter] = defaultdict(Counter)
        self.failure_errors: Counter = Counter()
        self.kept: Counter = Counter()
        self.discarded: Counter = Counter()
        self.failures: Counter = Counter()
        self.samples = 1

    def add(self, line: Line, item: int) -> None:
        record = line.record
        sample = record.get("sample_index")
        if isinstance(sample, int) and not isinstance(sample, bool):
            self.samples = max(self.samples, sample + 1)
        key = answer_key(record)
        if line.kind == "failed":
            self.stats.add_failed_attempt(record)
            self.failure_errors[one_line(record.get("error") or "no error text")] += 1
            if key is not None:
                self.failures[key] += 1
            return
        if line.kind == "trajectory":
            self.stats.add_trajectory(record)
            if key is not None:
                self.kept[key] += 1
            for turn in record["conversations"]:
                if turn["from"] == "tool" and (error := tool_error(turn["value"])) is not None:
                    self.tool_errors[turn.get("name") or "?"][error] += 1
        else:
            self.stats.add_discarded(record)
            if key is not None:
                self.discarded[key] += 1
        self.outcomes.add(record)
        cats = tuple(categories(record))
        for cat in cats:
            self.by_category.setdefault(cat, OutcomeStats()).add(record)
        reward = record.get("reward")
        check = record.get("check")
        status = check.get("status") if isinstance(check, dict) else None
        if status in ("passed", "failed") and isinstance(reward, int | float) and not isinstance(reward, bool):
            if math.isfinite(reward):
                self.rewards.append((float(reward), tuple(record.get("toolsets_used") or ()), cats))
        calls = record.get("api_calls")
        calls = calls if isinstance(calls, int) and not isinstance(calls, bool) else 0
        self.usage.append((item, tokens_of(record), cost_of(record.get("usage")), seconds_of(record), calls))

    def last_words(self, total: int | None) -> dict:
        """Samples by their last word, as statistics.json's `samples` (the total from checkpoint.json: the
        dataset is not read, so a sample no line mentions is counted as not run only when the total is known)."""
        done = sum(self.kept.values())
        discarded = sum(self.discarded.values())
        failed = sum(1 for k in self.failures if not self.kept[k] and not self.discarded[k])
        not_run = max(0, total - done - discarded - failed) if total is not None else None
        return {"total": total, "done": done, "discarded": discarded, "failed": failed, "not_run": not_run}

    def to_dict(self, run_name: str, checkpoint: dict, counts: dict[str, ReadCounts]) -> dict:
        total = checkpoint.get("total_prompts")
        total = total * self.samples if isinstance(total, int) and not isinstance(total, bool) else None
        by_end = self.last_words(total)
        self.stats.count_failed_samples(by_end["failed"])
        stats = self.stats.to_dict(
            run_name=run_name,
            model=checkpoint.get("model"),
            distribution=checkpoint.get("distribution"),
            samples=by_end,
            merge=merge_counts(counts["trajectory"]),
            duration_seconds=checkpoint.get("duration_seconds"),
        )
        stats["outcomes"] = self.outcomes.to_dict(self.samples)
        return {
            "statistics": stats,
            "skipped": {kind: c.skipped() for kind, c in counts.items()},
            "by_category": self._by_category(),
            "rewards": self._reward_histograms(),
            "usage": self._usage(),
            "tool_errors": {
                name: [[text, n] for text, n in c.most_common(ERROR_TEXTS)] for name, c in self.tool_errors.items()
            },
            "failure_errors": [[text, n] for text, n in self.failure_errors.most_common(20)],
            "failure_errors_distinct": len(self.failure_errors),
        }

    def _by_category(self) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        for (name, value), stats in sorted(self.by_category.items()):
            figures = stats.to_dict(self.samples)
            figures.pop("by_toolset")
            out.setdefault(name, {})[value] = figures
        return out

    def _reward_histograms(self) -> dict:
        """Reward histograms (checked samples with a result) overall, by toolset and by category, on one scale."""
        if not self.rewards:
            return {}
        values = [r for r, _, _ in self.rewards]
        lo, hi = min(0.0, min(values)), max(1.0, max(values))
        edges = [lo + (hi - lo) * i / 10 for i in range(11)]

        def counts(selected) -> list[int]:
            bins = [0] * 10
            for r in selected:
                bins[min(9, int((r - lo) / (hi - lo) * 10))] += 1
            return bins

        toolsets = sorted({t for _, ts, _ in self.rewards for t in ts})
        cats = sorted({c for _, _, cs in self.rewards for c in cs})
        return {
            "edges": edges,
            "all": counts(values),
            "by_toolset": {t: counts(r for r, ts, _ in self.rewards if t in ts) for t in toolsets},
            "by_category": {f"{n}: {v}": counts(r for r, _, cs in self.rewards if (n, v) in cs) for n, v in cats},
        }

    def _usage(self) -> dict:
        """Tokens, cost and duration per sample (trajectories and discards): histograms, quantiles, the top ones."""
        out = {}
        for field, at in (("tokens", 1), ("cost", 2), ("seconds", 3)):
            values = [u[at] for u in self.usage if u[at] is not None]
            out[field] = distribution(values)
        by_cost = 2 if any(u[2] for u in self.usage) else 1
        out["costliest_by"] = "cost" if by_cost == 2 else "tokens"
        out["costliest"] = [u[0] for u in sorted(self.usage, key=lambda u: (-u[by_cost], u[0]))[:TOP]]
        timed = [u for u in self.usage if u[3] is not None]
        out["slowest_by"] = "seconds" if timed else "api_calls"
        slow = sorted(timed, key=lambda u: (-u[3], u[0])) if timed else sorted(self.usage, key=lambda u: (-u[4], u[0]))
        out["slowest"] = [u[0] for u in slow[:TOP]]
        return out


def distribution(values: list) -> dict | None:
    """Count, total, mean, quantiles and a 20-bin histogram from 0 to the largest value; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    n = len(ordered)
    top = ordered[-1]
    bins = [0] * 20
    for v in ordered:
        bins[min(19, int(v / top * 20)) if top > 0 else 0] += 1

    def q(p: float):
        return ordered[min(n - 1, int(p * n))]

    return {
        "count": n,
        "total": sum(ordered),
        "mean": sum(ordered) / n,
        "p50": q(0.5),
        "p90": q(0.9),
        "p99": q(0.99),
        "max": top,
        "edges": [top * i / 20 for i in range(21)],
        "bins": bins,
    }
