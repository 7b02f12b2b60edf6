"""`openai`: one line per trajectory, `messages` in OpenAI chat format and `tools` as function schemas.

What OpenAI fine-tuning and TRL's SFTTrainer (through the model's chat template) take. Beside them, fields
the trainers ignore: the outcome (`sample_index`, `reward`, `passed`, `check`), the Harbor `task`, and each
assistant message's `logprobs`. The README.md beside the lines declares the schema, so `datasets.load_dataset(DIR)` loads any mix.
"""

from __future__ import annotations

from agentbatch.export.common import JsonlWriter, outcome, parsed_tools, turn_logprobs
from trajectory import to_openai_messages

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
    - name: logprobs
      struct:
      - name: tokens
        list: string
      - name: logprobs
        list: float64
      - name: token_ids
        list: int64
  - name: tools
    dtype: json
  - name: sample_index
    dtype: int64
  - name: reward
    dtype: float64
  - name: passed
    dtype: bool
  - name: check
    dtype: json
  - name: task
    struct:
    - name: name
      dtype: string
    - name: difficulty
      dtype: string
    - name: category
      dtype: string
    - name: tags
      list: string
    - name: image
      dtype: string
    - name: image_id
      dtype: string
"""


def to_line(record: dict) -> dict:
    """A trajectory line → the openai export line."""
    conversations = record.get("conversations") or []
    messages = to_openai_messages(conversations)
    gpt = [t for t in conversations if t.get("from") == "gpt"]
    for turn, message in zip(gpt, (m for m in messages if m["role"] == "assistant"), strict=True):
        logprobs = turn_logprobs(turn)
        if logprobs is not None:
            message["logprobs"] = logprobs
    return {"messages": messages, "tools": parsed_tools(record), **outcome(record)}


class Writer(JsonlWriter):
    features = FEATURES
    to_line = staticmethod(to_line)
    card_text = (
        "# {run_name}: OpenAI chat format\n\n"
        "{written} trajectories, one per line of `{file}`: `messages` (user, assistant with "
        "`reasoning_content` and `tool_calls`, tool with `tool_call_id`) and `tools` (the function schemas "
        "offered), then `sample_index`, `reward`, `passed` and `check` (the verified outcome), `task` (a Harbor "
        "task's name, difficulty, category, tags and image) and, on assistant messages, `logprobs`. Written by "
        "batch-runner's `--export=openai`.\n"
    )
