"""`openai`: one line per trajectory, `messages` in OpenAI chat format and `tools` as function schemas.

What OpenAI fine-tuning and TRL's SFTTrainer (through the model's chat template) take. The README.md beside
the lines declares the schema, so `datasets.load_dataset(DIR)` loads any mix of lines.
"""

from __future__ import annotations

import json
from pathlib import Path

from agentbatch.export.common import ExportContext, parsed_tools, write_card, write_jsonl_line
from trajectory import from_openai_messages, to_openai_messages

FILE = "data.jsonl"
FEATURES = """\
  - name: messages
    list:
    - name: role
      dtype: string
    - name: content
      dtype: string
    - name: reasoning_content
      dtype: string
    - name: tool_calls
      list:
      - name: id
        dtype: string
      - name: type
        dtype: string
      - name: function
        struct:
        - name: name
          dtype: string
        - name: arguments
          dtype: string
    - name: tool_call_id
      dtype: string
  - name: tools
    dtype: json
"""


def to_line(record: dict) -> dict:
    """A trajectory line → the openai export line."""
    return {"messages": to_openai_messages(record.get("conversations") or []), "tools": parsed_tools(record)}


def to_trajectory(line: dict) -> dict:
    """An openai export line → the trajectory fields it holds (`conversations`, `tools` as our JSON string)."""
    return {
        "conversations": from_openai_messages(line.get("messages") or []),
        "tools": json.dumps(line.get("tools") or [], ensure_ascii=False),
    }


class Writer:
    def __init__(self, out: Path, ctx: ExportContext):
        self.out, self.ctx = out, ctx
        self.f = open(out / FILE, "w", encoding="utf-8", errors="backslashreplace")
        self.written = 0

    def add(self, record: dict, raw: bytes = b"") -> None:
        write_jsonl_line(self.f, to_line(record))
        self.written += 1

    def finish(self) -> dict:
        self.f.close()
        body = (
            f"# {self.ctx.run_name}: OpenAI chat format\n\n"
            f"{self.written} trajectories, one per line of `{FILE}`: `messages` (user, assistant with "
            "`reasoning_content` and `tool_calls`, tool with `tool_call_id`) and `tools` (the function schemas "
            "offered). Written by batch-runner's `--export=openai`.\n"
        )
        write_card(self.out / "README.md", FEATURES, FILE, body)
        return {"written": self.written}
