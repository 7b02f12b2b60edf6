"""A plug-in for the tests: `--model=scripted` answers from a script, with no endpoint (model/registry.py).

The first call of a sample runs `echo` through the terminal tool; once a tool result is in the conversation,
it answers with the last tool result's text.
"""

import json

from agentbatch import ScriptedModel, register_model


def _reply(messages: list[dict]) -> dict:
    results = [m for m in messages if m.get("role") == "tool"]
    if not results:
        return {"tool_calls": [{"name": "terminal", "arguments": {"command": "echo plugged in"}}]}
    output = json.loads(results[-1]["content"]).get("output", "")
    return {"content": f"the terminal said: {output.strip()}", "reasoning": "I ran echo"}


@register_model("scripted")
def scripted(settings):
    return ScriptedModel([_reply])
