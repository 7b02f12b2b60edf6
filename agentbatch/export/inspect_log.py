"""`inspect`: the run as one Inspect AI eval log (written by inspect_ai's own log API), for `inspect view`.

Every trajectory is a sample (id: its prompt index, epoch: its sample index + 1) with its messages, tool
calls, usage and an `outcome` score (answered, max_turns, length, context, invalid_tools, discarded or
failed); discarded prompts appear with their reason, and prompts that only failed appear once, with their
last error as the sample's error. A check that gave a result is the `check` score (its reward; passed, the
check and the sample index in its metadata), summed up in the log's results; a reply's logprobs are in its
message's metadata, and the last reply's also in the output choice when every one is a number.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentbatch.export.common import ExportContext, FormatWriter, split_arguments, turn_logprobs
from agentbatch.export.common import outcome as outcome_fields
from trajectory import result_succeeded, split_think_block

# Our stop_reason → the nearest of Inspect's stop reasons for the last model output.
# trajectory.STOP_REASONS in Inspect's words (its ModelOutput.stop_reason); the others are "unknown" there.
INSPECT_STOP_REASON = {"answered": "stop", "max_turns": "tool_calls", "length": "max_tokens", "context": "model_length"}
_CORE = ("conversations", "tools", "usage", "metadata", "discard_reason")


def _object(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int:
    """A token count as Inspect takes it: a whole number, 0 for anything else (a hand-edited line)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _utc(timestamp: Any) -> str | None:
    """Our timestamps are naive UTC (now_iso); Inspect wants them aware."""
    if not isinstance(timestamp, str):
        return None
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).isoformat()


class Writer(FormatWriter):
    takes_all_outcomes = True  # discarded and failed prompts too

    def __init__(self, out: Path, ctx: ExportContext):
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
        import inspect_ai.tool as tool
        from inspect_ai._util.error import EvalError

        super().__init__(out, ctx)
        self.log, self.model, self.scorer, self.tool, self.EvalError = log, model, scorer, tool, EvalError
        self.samples: list = []
        self.outcomes: dict[str, int] = {}
        self.ids: set[tuple[str, int]] = set()
        self.models: dict[str, Any] = {}
        self.rewards: list[float] = []
        self.verdicts: list[bool] = []

    def add(self, record: dict, raw: bytes = b"") -> None:
        self._add(record, str(record.get("stop_reason") or ("answered" if record.get("completed") else "max_turns")))

    def add_discarded(self, line: dict) -> None:
        self._add(line, "discarded")

    def add_failed(self, line: dict) -> None:
        # A failed attempt's line is any JSON object (run_dir's rule: its usage counts): what is read of it here is
        # taken only where it has the type the recorder writes.
        prompt = line.get("prompt")
        turns = [{"from": "human", "value": prompt if isinstance(prompt, str) else ""}]
        record = dict(
            line, conversations=turns, metadata={"batch_num": line.get("batch_num"), "timestamp": line.get("timestamp")}
        )
        record.pop("prompt", None)
        self._add(record, "failed", error=str(line.get("error") or "failed"))

    def _sample_id(self, record: dict) -> tuple[str, int]:
        base = str(record.get("prompt_index", "?"))
        epoch = outcome_fields(record)["sample_index"] + 1
        sample_id, n = base, 1
        while (sample_id, epoch) in self.ids:  # the same index in two sessions over a changed dataset
            n += 1
            sample_id = f"{base}-{n}"
        self.ids.add((sample_id, epoch))
        return sample_id, epoch

    def _messages(self, record: dict, model_name: str | None) -> list:
        m, tool = self.model, self.tool
        messages = []
        for t in record.get("conversations") or []:
            kind = t.get("from")
            if kind == "human":
                messages.append(m.ChatMessageUser(content=t.get("value") or ""))
            elif kind == "system":
                messages.append(m.ChatMessageSystem(content=t.get("value") or ""))
            elif kind == "gpt":
                reasoning, content = split_think_block(t.get("value") or "")
                parts = [m.ContentReasoning(reasoning=reasoning), m.ContentText(text=content)] if reasoning else content
                calls = []
                for c in t.get("tool_calls") or ():
                    arguments, raw = split_arguments(c.get("arguments"))
                    calls.append(
                        tool.ToolCall(
                            id=str(c.get("id")),
                            function=str(c.get("name")),
                            arguments=arguments,
                            parse_error=None if raw is None else f"arguments are not a JSON object: {raw}",
                        )
                    )
                logprobs = turn_logprobs(t)
                messages.append(
                    m.ChatMessageAssistant(
                        content=parts,
                        tool_calls=calls or None,
                        model=model_name,
                        metadata={"logprobs": logprobs} if logprobs is not None else None,
                    )
                )
            elif kind == "tool":
                value = t.get("value") or ""
                error = None if result_succeeded(value) else tool.ToolCallError("unknown", value)
                messages.append(
                    m.ChatMessageTool(
                        content=value, tool_call_id=t.get("tool_call_id"), function=t.get("name"), error=error
                    )
                )
        return messages

    def _add(self, record: dict, outcome: str, error: str | None = None) -> None:
        m, meta = self.model, _object(record.get("metadata"))
        model_name = _text(meta.get("model")) or _text(self.ctx.checkpoint.get("model"))
        messages = self._messages(record, model_name)
        usage_line = _object(record.get("usage"))
        cost = usage_line.get("cost", usage_line.get("cost_usd"))
        usage = m.ModelUsage(
            input_tokens=_count(usage_line.get("prompt_tokens")),
            output_tokens=_count(usage_line.get("completion_tokens")),
            total_tokens=_count(usage_line.get("total_tokens")),
            total_cost=float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        )
        last = next((x for x in reversed(messages) if isinstance(x, m.ChatMessageAssistant)), None)
        choices = (
            [
                m.ChatCompletionChoice(
                    message=last, stop_reason=INSPECT_STOP_REASON.get(outcome, "unknown"), logprobs=self._logprobs(last)
                )
            ]
            if last
            else []
        )
        explanation = record.get("discard_reason") or error
        scores = {"outcome": self.scorer.Score(value=outcome, explanation=explanation)}
        check = self._check_score(record)
        if check is not None:
            scores["check"] = check
        metadata = {**outcome_fields(record), **{k: v for k, v in record.items() if k not in _CORE}}
        metadata.update(outcome=outcome, batch_num=meta.get("batch_num"), timestamp=meta.get("timestamp"))
        if record.get("discard_reason"):
            metadata["discard_reason"] = record["discard_reason"]
        sample_id, epoch = self._sample_id(record)
        prompt = next((t.get("value") for t in record.get("conversations") or () if t.get("from") == "human"), "")
        self.samples.append(
            self.log.EvalSample(
                id=sample_id,
                epoch=epoch,
                input=prompt or "",
                target="",
                messages=messages,
                output=m.ModelOutput(
                    model=model_name or "", choices=choices, completion=last.text if last else "", usage=usage
                ),
                scores=scores,
                metadata=metadata,
                model_usage={model_name: usage} if model_name else {},
                completed_at=_utc(meta.get("timestamp")),
                error=self.EvalError(message=error, traceback=error, traceback_ansi=error) if error else None,
            )
        )
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if model_name:
            total = self.models.setdefault(model_name, m.ModelUsage())
            total.input_tokens += usage.input_tokens
            total.output_tokens += usage.output_tokens
            total.total_tokens += usage.total_tokens

    def _check_score(self, record: dict):
        """The `check` score: the reward, or 1/0 from the verdict; None when the check gave no result (none,
        timeout, error), which the sample's metadata still shows."""
        reward, passed = record.get("reward"), record.get("passed")
        if isinstance(reward, (int, float)) and not isinstance(reward, bool):
            value = float(reward)
        elif isinstance(passed, bool):
            value = float(passed)
        else:
            return None
        self.rewards.append(value)
        if isinstance(passed, bool):
            self.verdicts.append(passed)
        fields = outcome_fields(record)
        check = fields["check"] if isinstance(fields["check"], dict) else {}
        return self.scorer.Score(
            value=value,
            answer="passed" if passed is True else "failed" if passed is False else None,
            explanation=str(check.get("output") or "") or None,
            metadata=fields,
        )

    def _logprobs(self, message):
        """The output choice's logprobs, from the reply's own (Inspect's are numbers: None if one is null)."""
        logprobs = (message.metadata or {}).get("logprobs") if message is not None else None
        if not logprobs:
            return None
        tokens, values = logprobs.get("tokens") or [], logprobs.get("logprobs") or []
        if len(tokens) != len(values) or not all(isinstance(v, (int, float)) for v in values):
            return None
        return self.model.Logprobs(
            content=[self.model.Logprob(token=str(t), logprob=float(v)) for t, v in zip(tokens, values, strict=True)]
        )

    def finish(self) -> dict:
        log = self.log
        ctx = self.ctx
        checkpoint = ctx.checkpoint
        state = checkpoint.get("state")
        status = "success" if state == "finished" else "started" if state == "running" else "cancelled"
        n = len(self.samples)
        failed = self.outcomes.get("failed", 0)
        metrics = {
            name: log.EvalMetric(name=name, value=count / n if n else 0.0)
            for name, count in sorted(self.outcomes.items())
        }
        created = _utc(checkpoint.get("updated_at")) or datetime.now(UTC).isoformat()
        model_name = checkpoint.get("model") or next(iter(self.models), "unknown")
        eval_log = log.EvalLog(
            status=status,
            eval=log.EvalSpec(
                created=created,
                task=ctx.run_name,
                dataset=log.EvalDataset(name=ctx.run_name, location=checkpoint.get("dataset_file"), samples=n),
                model=model_name,
                config=log.EvalConfig(),
                metadata={
                    "distribution": checkpoint.get("distribution"),
                    "exported_by": "batch-runner --export=inspect",
                },
            ),
            results=log.EvalResults(
                total_samples=n,
                completed_samples=n - failed,
                scores=[log.EvalScore(name="outcome", scorer="outcome", metrics=metrics), *self._check_results()],
            ),
            stats=log.EvalStats(started_at=created, completed_at=created, model_usage=self.models),
            samples=self.samples,
        )
        log.write_eval_log(eval_log, str(self.out / f"{ctx.run_name}.eval"))
        return {"written": n, "outcomes": dict(self.outcomes)}

    def _check_results(self) -> list:
        """The `check` scorer's figures over the samples it scored: mean reward and pass rate."""
        if not self.rewards:
            return []
        log = self.log
        metrics = {"mean": log.EvalMetric(name="mean", value=sum(self.rewards) / len(self.rewards))}
        if self.verdicts:
            metrics["pass_rate"] = log.EvalMetric(name="pass_rate", value=sum(self.verdicts) / len(self.verdicts))
        return [log.EvalScore(name="check", scorer="check", scored_samples=len(self.rewards), metrics=metrics)]
