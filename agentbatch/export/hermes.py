"""`hermes`: the trajectory lines the original agent's own batch runner writes, so our data mixes with its datasets.

The tool list goes in a leading system turn (<tools>…</tools>, in the Hermes function-calling prompt), every gpt
turn starts with a <think> block (empty when the model did not reason), tool calls are <tool_call> blocks in
the gpt value, and all results of one reply form one `tool` turn of <tool_response> blocks. A line has the
original's keys, plus `sample_index` and `extra` (the outcome and logprobs as JSON text, common.outcome_text).
"""

from __future__ import annotations

import json

from agentbatch.export.common import JsonlWriter, outcome, outcome_text, parse_text, parsed_tools
from trajectory import split_think_block

# The Hermes function-calling system prompt, as the original runner writes it (its text is part of the format).
SYSTEM_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within <tools> </tools> "
    "XML tags. You may call one or more functions to assist with the user query. If available tools are not "
    "relevant in assisting with user query, just respond in natural conversational language. Don't make "
    "assumptions about what values to plug into functions. After calling & executing the functions, you will be "
    "provided with function results within <tool_response> </tool_response> XML tags. Here are the available "
    "tools:\n<tools>\n{tools}\n</tools>\nFor each function call return a JSON object, with the following pydantic "
    "model json schema for each:\n{{'title': 'FunctionCall', 'type': 'object', 'properties': {{'name': {{'title': "
    "'Name', 'type': 'string'}}, 'arguments': {{'title': 'Arguments', 'type': 'object'}}}}, 'required': ['name', "
    "'arguments']}}\nEach function call should be enclosed within <tool_call> </tool_call> XML tags.\n"
    "Example:\n<tool_call>\n{{'name': <function-name>,'arguments': <args-dict>}}\n</tool_call>"
)
KEYS = ("prompt_index", "conversations", "metadata", "completed", "partial", "api_calls", "toolsets_used")
FEATURES = """\
  - name: prompt_index
    dtype: int64
  - name: conversations
    list:
    - name: from
      dtype: string
    - name: value
      dtype: string
  - name: metadata
    struct:
    - name: batch_num
      dtype: int64
    - name: timestamp
      dtype: string
    - name: model
      dtype: string
  - name: completed
    dtype: bool
  - name: partial
    dtype: bool
  - name: api_calls
    dtype: int64
  - name: toolsets_used
    list: string
  - name: tool_stats
    dtype: json
  - name: tool_error_counts
    dtype: json
  - name: sample_index
    dtype: int64
  - name: extra
    dtype: string
"""


def system_turn(record: dict) -> dict:
    tools = [
        {
            "name": f.get("name"),
            "description": f.get("description", ""),
            "parameters": f.get("parameters", {}),
            "required": None,
        }
        for f in (t.get("function") or {} for t in parsed_tools(record))
    ]
    return {"from": "system", "value": SYSTEM_PROMPT.format(tools=json.dumps(tools, ensure_ascii=False))}


def gpt_value(turn: dict) -> str:
    reasoning, content = split_think_block(turn.get("value") or "")
    text = f"<think>\n{reasoning}\n</think>\n" if reasoning else "<think>\n</think>\n"
    if turn.get("tool_calls"):
        if content.strip():
            text += content + "\n"
        for c in turn["tool_calls"]:
            arguments = c.get("arguments")
            try:
                arguments = parse_text(arguments) if isinstance(arguments, str) else arguments
            except ValueError:
                pass  # not JSON: kept as the text the model wrote (the original would write {})
            call = json.dumps({"name": c.get("name"), "arguments": arguments}, ensure_ascii=False)
            text += f"<tool_call>\n{call}\n</tool_call>\n"
        return text.rstrip()
    return (text + content).strip()


def tool_response(turn: dict) -> str:
    content = turn.get("value") or ""
    if content.strip().startswith(("{", "[")):
        try:
            content = parse_text(content)
        except ValueError:
            pass
    payload = {"tool_call_id": turn.get("tool_call_id") or "", "name": turn.get("name"), "content": content}
    return f"<tool_response>\n{json.dumps(payload, ensure_ascii=False)}\n</tool_response>"


def to_line(record: dict) -> dict:
    turns = [system_turn(record)]
    results: list[str] = []
    for t in record.get("conversations") or []:
        kind = t.get("from")
        if kind != "tool" and results:
            turns.append({"from": "tool", "value": "\n".join(results)})
            results = []
        if kind == "human":
            turns.append({"from": "human", "value": t.get("value") or ""})
        elif kind == "gpt":
            turns.append({"from": "gpt", "value": gpt_value(t)})
        elif kind == "tool":
            results.append(tool_response(t))
    if results:
        turns.append({"from": "tool", "value": "\n".join(results)})
    line = {k: record.get(k) for k in KEYS}
    line["conversations"] = turns
    line["tool_stats"] = record.get("tool_stats") or {}
    line["tool_error_counts"] = record.get("tool_error_counts") or {}
    line["sample_index"] = outcome(record)["sample_index"]
    # One gpt turn here per gpt turn of the line, in order: logprobs line up with them.
    line["extra"] = outcome_text(record, [t for t in record.get("conversations") or () if t.get("from") == "gpt"])
    return line


class Writer(JsonlWriter):
    features = FEATURES
    to_line = staticmethod(to_line)
    card_text = (
        "# {run_name}: Hermes agent trajectories\n\n"
        "{written} trajectories in `{file}`, in the form the original agent's batch runner writes, "
        "plus `sample_index` and `extra` (JSON text: `reward`, `passed`, `check`, `task` and the gpt turns' `logprobs`). "
        "Written by batch-runner's `--export=hermes`.\n"
    )
