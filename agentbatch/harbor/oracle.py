"""`--model=oracle`: a replay model that runs each Harbor task's reference solution (docs/harbor.md, "Oracle").

Its first reply is one terminal call, `/solution/solve.sh` (the runner copies the task's solution/ to /solution
just before, solve.sh made executable: it runs as its first line says, as Harbor runs it); its second is a final
answer quoting the exit code. No endpoint, no key, no tokens:
the tests then tell which tasks' reference solutions do not pass, before a model is paid for.
"""

from __future__ import annotations

import json

from agentbatch.harbor.names import FORMAT, SOLUTION_DIR
from agentbatch.model.base import ModelCallError, Reply
from agentbatch.model.registry import register_model

NAME = "oracle"
COMMAND = f"{SOLUTION_DIR}/solve.sh"
# The terminal tool's own cap still applies; the task's agent timeout cuts the command (the sample's deadline).
COMMAND_TIMEOUT = 24 * 3600.0
_NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
# What a run needs for it, unless given: its one command needs the terminal, its time is the task's, it never reasons.
IMPLIED_FLAGS = {"distribution": "terminal_only", "require_reasoning": False, "command_timeout": COMMAND_TIMEOUT}
REFUSAL = (
    f"--model={NAME} runs Harbor tasks' reference solutions: --dataset_file must name a Harbor task directory or "
    "a directory of them"
)


def reply(messages: list[dict], tools: list[dict] | None = None) -> dict:
    """The oracle's OpenAI-shaped reply to a conversation: run the solution, then answer with its exit code."""
    ran = [m for m in messages if m.get("role") == "tool"]
    if not ran:
        if tools is not None and not any((t.get("function") or {}).get("name") == "terminal" for t in tools):
            message = {"role": "assistant", "content": "The oracle needs the terminal tool to run solve.sh."}
            return _choice(message)
        call = {
            "id": "oracle_0",
            "type": "function",
            "function": {
                "name": "terminal",
                "arguments": json.dumps({"command": COMMAND, "timeout": COMMAND_TIMEOUT}),
            },
        }
        return _choice({"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls")
    try:
        code = json.loads(ran[-1].get("content") or "{}").get("exit_code")
    except (ValueError, AttributeError):
        code = None
    return _choice({"role": "assistant", "content": f"The reference solution ran: {COMMAND} exited with {code}."})


def _choice(message: dict, finish: str = "stop") -> dict:
    return {
        "id": "oracle",
        "object": "chat.completion",
        "model": NAME,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": dict(_NO_USAGE),
    }


@register_model(NAME, implies=IMPLIED_FLAGS, dataset_formats=(FORMAT,), refusal=REFUSAL)
class OracleModel:
    """The oracle as a model (model seam): `chat` replays the reference solution; it makes no images."""

    def __init__(self, settings=None):
        self.settings = settings

    def chat(self, messages: list[dict], tools: list[dict] | None = None, model=None, deadline=None) -> Reply:
        return Reply(reply(messages, tools))

    def generate_image(self, request: dict) -> Reply:
        raise ModelCallError("the oracle makes no images: --model=oracle runs Harbor tasks' solutions only")
