"""`atif`: one Agent Trajectory Interchange Format document per trajectory, validated by the `atif` package.

A user step holds the prompt; each model reply is an agent step with its reasoning, tool calls and, as its
observation, the results of those calls. Arguments that are not a JSON object become `{}` with the text the
model wrote in the call's `extra.raw_arguments`. A reply's logprobs go in its step's `metrics`: `logprobs` and
`completion_token_ids` where ATIF has them (its logprobs are floats: a list holding a null goes to
`metrics.extra.logprobs` instead), the token texts in `metrics.extra.tokens`. Everything else of the line that
ATIF has no field for is kept in the document's `extra` (the outcome among it) and a turn's in its step's `extra`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentbatch.export.common import (
    ExportContext,
    FormatWriter,
    outcome,
    parsed_tools,
    split_arguments,
    turn_logprobs,
    write_card,
)
from trajectory import split_think_block

SCHEMA_VERSION = "ATIF-v1.8"
AGENT_NAME = "batch-runner"
_TURN_KEYS = ("from", "value", "tool_calls", "tool_call_id", "name")
_MOVED_KEYS = ("conversations", "tools", "usage")
FEATURES = """\
  - name: schema_version
    dtype: string
  - name: session_id
    dtype: string
  - name: trajectory_id
    dtype: string
  - name: agent
    dtype: json
  - name: steps
    list:
    - name: step_id
      dtype: int64
    - name: source
      dtype: string
    - name: model_name
      dtype: string
    - name: message
      dtype: string
    - name: reasoning_content
      dtype: string
    - name: tool_calls
      dtype: json
    - name: observation
      dtype: json
    - name: metrics
      dtype: json
    - name: extra
      dtype: json
  - name: final_metrics
    dtype: json
  - name: extra
    dtype: json
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("batch-runner")
    except PackageNotFoundError:
        return "0"


def _numbers(values, kind) -> bool:
    return isinstance(values, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in values)


def step_metrics(turn: dict) -> dict | None:
    """Per-reply token figures, where the line has them: the reply's logprobs (and usage, if a turn carries it)."""
    metrics: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    usage = turn.get("usage")
    if isinstance(usage, dict):
        for key in ("prompt_tokens", "completion_tokens"):
            if isinstance(usage.get(key), int):
                metrics[key] = usage[key]
        if isinstance(usage.get("cost"), (int, float)):
            metrics["cost_usd"] = float(usage["cost"])
    logprobs = turn_logprobs(turn)
    if logprobs is not None:
        values, ids = logprobs.get("logprobs"), logprobs.get("token_ids")
        if values and _numbers(values, (int, float)):
            metrics["logprobs"] = [float(v) for v in values]
        elif values:  # a null (a server's -inf) or other value ATIF's list of floats cannot hold
            extra["logprobs"] = values
        if ids and _numbers(ids, int):
            metrics["completion_token_ids"] = ids
        elif ids:
            extra["token_ids"] = ids
        extra["tokens"] = logprobs.get("tokens")
        extra.update({k: v for k, v in logprobs.items() if k not in ("tokens", "logprobs", "token_ids")})
    if extra:
        metrics["extra"] = extra
    return metrics or None


def to_document(record: dict, run_name: str, number: int) -> dict:
    """A trajectory line → an ATIF document (a dict; validated by the caller)."""
    model = (record.get("metadata") or {}).get("model")
    model = model if isinstance(model, str) else None  # a hand edit's other value: ATIF's model_name is text
    steps: list[dict] = []
    for t in record.get("conversations") or []:
        kind = t.get("from")
        extra = {k: v for k, v in t.items() if k not in _TURN_KEYS}
        if kind in ("human", "system"):
            steps.append({"source": "user" if kind == "human" else "system", "message": t.get("value") or ""})
        elif kind == "gpt":
            reasoning, content = split_think_block(t.get("value") or "")
            step: dict[str, Any] = {"source": "agent", "message": content}
            if model:
                step["model_name"] = model
            if reasoning:
                step["reasoning_content"] = reasoning
            if t.get("tool_calls"):
                step["tool_calls"] = []
                for c in t["tool_calls"]:
                    arguments, raw = split_arguments(c.get("arguments"))
                    call = {"tool_call_id": str(c.get("id")), "function_name": c.get("name"), "arguments": arguments}
                    if raw is not None:
                        call["extra"] = {"raw_arguments": raw}
                    step["tool_calls"].append(call)
            metrics = step_metrics(t)
            if metrics:
                step["metrics"] = metrics
            if turn_logprobs(t) is not None:
                extra.pop("logprobs")  # in the step's metrics
            if extra:
                step["extra"] = extra
            steps.append(step)
        elif kind == "tool":
            result: dict[str, Any] = {"source_call_id": str(t.get("tool_call_id")), "content": t.get("value") or ""}
            result["extra"] = {"name": t.get("name"), **extra}
            owner = steps[-1] if steps else None
            if owner is None:
                continue
            if result["source_call_id"] not in {c["tool_call_id"] for c in owner.get("tool_calls") or ()}:
                result.pop("source_call_id")  # a result answering no call of its step is a system event in ATIF
            owner.setdefault("observation", {"results": []})["results"].append(result)
    for i, step in enumerate(steps, start=1):
        step["step_id"] = i
    usage = record.get("usage") or {}
    final = {
        "total_prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "total_completion_tokens": int(usage.get("completion_tokens") or 0),
        "total_steps": len(steps),
        "extra": {"total_tokens": int(usage.get("total_tokens") or 0)},
    }
    cost = usage.get("cost", usage.get("cost_usd"))
    if isinstance(cost, (int, float)):
        final["total_cost_usd"] = float(cost)
    other_usage = {k: v for k, v in usage.items() if k not in ("prompt_tokens", "completion_tokens", "total_tokens")}
    if other_usage:
        final["extra"]["usage"] = other_usage
    doc_extra = {**outcome(record), **{k: v for k, v in record.items() if k not in _MOVED_KEYS}}
    session = f"{run_name}/{record.get('prompt_index')}/{record.get('sample_index', 0)}"
    agent = {"name": AGENT_NAME, "version": _version(), "tool_definitions": parsed_tools(record)}
    if model:
        agent["model_name"] = model
    return {
        "schema_version": SCHEMA_VERSION,
        "session_id": session,
        "trajectory_id": f"{number:06d}",
        "agent": agent,
        "steps": steps,
        "final_metrics": final,
        "extra": doc_extra,
    }


class Writer(FormatWriter):
    def __init__(self, out: Path, ctx: ExportContext):
        from atif import Trajectory  # the format's own models check every document before it is written

        super().__init__(out, ctx)
        self.Trajectory = Trajectory
        (out / "trajectories").mkdir()
        self.written = 0

    def add(self, record: dict, raw: bytes = b"") -> None:
        self.written += 1
        doc = self.Trajectory.model_validate(to_document(record, self.ctx.run_name, self.written))
        path = self.out / "trajectories" / f"{self.written:06d}.json"
        path.write_text(doc.model_dump_json(exclude_none=True), encoding="utf-8", errors="backslashreplace")

    def finish(self) -> dict:
        body = (
            f"# {self.ctx.run_name}: ATIF trajectories\n\n"
            f"{self.written} documents in `trajectories/`, one per trajectory, schema {SCHEMA_VERSION}. "
            "Written by batch-runner's `--export=atif`.\n"
        )
        write_card(self.out / "README.md", FEATURES, "trajectories/*.json", body)
        return {"written": self.written}
