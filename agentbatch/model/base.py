"""The model seam: what the agent loop and the tools ask of a model, whatever answers them.

`ModelClient` (client.py) answers over HTTP from any OpenAI-compatible endpoint; a model registered under a
name (model/registry.py: a scripted model for tests, a replay of a reference solution) answers without one.
A model is shared by the slots of a worker, so `chat` is called from several threads at once.
"""

from __future__ import annotations

from typing import Any, Protocol


class ModelCallError(Exception):
    """A model call failed for good (retries exhausted or an error retrying cannot fix): the sample fails."""


class ContextOverflow(ModelCallError):
    """The conversation no longer fits the model's context window."""


class DeadlineReached(ModelCallError):
    """The sample's time limit came before the model answered (the call was cut, or no retry fits before it)."""


class Reply(dict):
    """A reply's JSON in the OpenAI shape, also read by attribute (`r.choices[0].message`); absent is None.

    `Reply(plain_dict)` is a reply: nested objects are wrapped as they are read. Not the openai types:
    building their pydantic objects took ~0.1 ms a call, about a tenth of a worker's CPU per sample
    (bench/RESULTS.md), and the loop reads a handful of fields.
    """

    __slots__ = ()

    def __getattr__(self, key: str) -> Any:
        value = self.get(key)
        if type(value) is dict:
            return Reply(value)
        if type(value) is list and any(type(v) is dict for v in value):
            return [Reply(v) if type(v) is dict else v for v in value]
        return value


class Model(Protocol):
    """What answers the agent loop's and the tools' model calls."""

    def chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        model: str | None = None,
        deadline: float | None = None,
    ) -> Reply:
        """One chat completion: a reply with `choices[0].message` (content, tool_calls) and, if known, `usage`.

        `model` names another model than the run's (a tool's); `deadline` (time.monotonic) is the sample's
        time limit, past which the call raises DeadlineReached. Raises ModelCallError when it fails for good.
        """

    def generate_image(self, request: dict, deadline: float | None = None) -> Reply:
        """One images/generations call (OpenAI's images API): a reply with `data`; `deadline` as for chat."""
