"""`llama_factory`: LLaMA-Factory's sharegpt form with tools, and the dataset_info.json entry that registers it.

LLaMA-Factory wants `human` / `observation` turns at odd positions and `function_call` / `gpt` turns at even
ones (1-based), ending on a model turn. So the results of one reply's tool calls become one `observation` (a
JSON array of the result texts when there are several), a reply that calls tools becomes one `function_call`
(a JSON array of {name, arguments} when there are several), and the text and reasoning of such a reply go
before its calls in `<tool_call>…</tool_call>` (the default tool-call words, which LLaMA-Factory strips).
Beside the columns LLaMA-Factory reads, `sample_index` and `extra` (the outcome and logprobs as JSON text,
common.outcome_text), which it ignores.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from agentbatch.export.common import (
    ExportContext,
    JsonlWriter,
    outcome,
    outcome_text,
    parse_text,
    parsed_tools,
)

FILE = "data.jsonl"
USER_SIDE = ("human", "observation")
MODEL_SIDE = ("gpt", "function_call")
FEATURES = """\
  - name: conversations
    list:
    - name: from
      dtype: string
    - name: value
      dtype: string
  - name: system
    dtype: string
  - name: tools
    dtype: string
  - name: sample_index
    dtype: int64
  - name: extra
    dtype: string
"""


def function_call_value(turn: dict) -> str:
    """A gpt turn with tool calls → the value of its `function_call` turn."""
    calls = []
    for c in turn.get("tool_calls") or ():
        arguments = c.get("arguments")
        try:
            parsed = parse_text(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments  # not JSON: kept as the text the model wrote
        calls.append({"name": c.get("name"), "arguments": parsed})
    payload = json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)
    text = turn.get("value") or ""
    return f"{text}<tool_call>{payload}</tool_call>" if text else payload


def to_line(record: dict) -> tuple[dict | None, str | None]:
    """(the export line, None), or (None, why the trajectory cannot be written in this form)."""
    turns = record.get("conversations") or []
    out: list[dict] = []
    system = ""
    i = 0
    while i < len(turns):
        t = turns[i]
        kind = t.get("from")
        if kind == "system":
            system = t.get("value") or ""
        elif kind == "human":
            out.append({"from": "human", "value": t.get("value") or ""})
        elif kind == "gpt" and t.get("tool_calls"):
            out.append({"from": "function_call", "value": function_call_value(t)})
            results = []
            while i + 1 < len(turns) and turns[i + 1].get("from") == "tool":
                i += 1
                results.append(turns[i].get("value") or "")
            if results:
                value = results[0] if len(results) == 1 else json.dumps(results, ensure_ascii=False)
                out.append({"from": "observation", "value": value})
        elif kind == "gpt":
            out.append({"from": "gpt", "value": t.get("value") or ""})
        elif kind == "tool":
            return None, "tool_result_without_call"
        i += 1
    # The model's own turn is what LLaMA-Factory learns last: results or a prompt nobody answered are dropped.
    while out and out[-1]["from"] in USER_SIDE:
        out.pop()
    if not out:
        return None, "no_model_turn"
    for position, turn in enumerate(out):
        if turn["from"] not in (USER_SIDE, MODEL_SIDE)[position % 2]:
            return None, "turns_out_of_order"
    tools = [t.get("function", t) for t in parsed_tools(record)]
    line = {"conversations": out, "system": system, "tools": json.dumps(tools, ensure_ascii=False)}
    line["sample_index"] = outcome(record)["sample_index"]
    # Each gpt turn became one model turn (function_call or gpt), in order: logprobs line up with those.
    line["extra"] = outcome_text(record, [t for t in turns if t.get("from") == "gpt"])
    return line, None


class Writer(JsonlWriter):
    file = FILE
    features = FEATURES

    def __init__(self, out: Path, ctx: ExportContext):
        super().__init__(out, ctx)
        self.skipped: Counter = Counter()

    def add(self, record: dict, raw: bytes = b"") -> None:
        line, why = to_line(record)
        if line is None:
            self.skipped[why] += 1
        else:
            self.write(line)

    def card(self) -> str:
        name = self.ctx.run_name
        return (
            f"# {name}: LLaMA-Factory sharegpt format\n\n"
            f"{self.written} trajectories in `{FILE}`, registered as `{name}` by `dataset_info.json` "
            f"(train with `dataset_dir: {self.ctx.run_dir / 'export' / 'llama_factory'}` and `dataset: {name}`). "
            "`sample_index` and `extra` (JSON text: `reward`, `passed`, `check`, `task` and the model turns' `logprobs`) "
            "are ignored by LLaMA-Factory. Written by batch-runner's `--export=llama_factory`.\n"
        )

    def finish(self) -> dict:
        entry = {
            self.ctx.run_name: {
                "file_name": FILE,
                "formatting": "sharegpt",
                "columns": {"messages": "conversations", "system": "system", "tools": "tools"},
            }
        }
        (self.out / "dataset_info.json").write_text(json.dumps(entry, indent=2, ensure_ascii=False) + "\n")
        return {**super().finish(), "skipped": dict(self.skipped)}
