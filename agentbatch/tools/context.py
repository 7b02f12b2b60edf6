"""What one sample's tools share: its sandbox, the model client, the settings, its usage and its cleanups."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from agentbatch.limits import SampleLimits
from agentbatch.model.base import Model, Reply
from agentbatch.model.reasoning import split_reasoning
from agentbatch.model.usage import Usage
from agentbatch.sandboxes.base import Sandbox, SandboxError, SandboxSpec
from agentbatch.sandboxes.sample import SampleSandbox
from agentbatch.tools.settings import ToolSettings

# The settings every tool's waits come from: each is cut to the time the sample has left (ToolContext.settings).
TIMEOUT_SETTINGS = tuple(f.name for f in dataclasses.fields(ToolSettings) if f.name.endswith("_timeout"))


class ToolContext:
    """One sample's tool state; the sandbox is made on first use and everything is released by close()."""

    def __init__(
        self,
        settings: ToolSettings,
        spec: SandboxSpec,
        client: Model,
        usage: Usage | None = None,
        image_client: Model | None = None,
        limits: SampleLimits | None = None,
        redact: Callable[[str], str] | None = None,
    ):
        self._settings = settings
        # Applied to every tool result before the endpoint sees it (secrets_guard.Redactor).
        self.redact = redact or (lambda text: text)
        self.spec = spec
        self._sandbox = SampleSandbox(spec)
        self.client = client
        self.image_client = image_client or client
        self.usage = usage if usage is not None else Usage()
        # The session's deadline and token/cost limits; commands and model calls are cut at the deadline.
        self.limits = limits or SampleLimits(usage=self.usage)
        self.resources: dict[str, Any] = {}
        self._cleanups: list[Callable[[], None]] = []

    @property
    def settings(self) -> ToolSettings:
        """The tools' settings, every `*_timeout` in them cut to the time the sample has left.

        This is what keeps every tool, built-in or plug-in, within --prompt_timeout: a tool takes its waits
        from here (or from `limits.cap` for a wait of its own), so none outlasts the sample's deadline.
        """
        left = self.limits.time_left()
        s = self._settings
        if left is None:
            return s
        cut = {name: min(getattr(s, name), left) for name in TIMEOUT_SETTINGS if getattr(s, name) > left}
        return dataclasses.replace(s, **cut) if cut else s

    def sandbox(self) -> Sandbox:
        """The prompt's sandbox, created on first use (TimeoutError, ended as "time", if the time limit comes first)."""
        return self._sandbox.get(self.limits.time_left())

    def start_sandbox_early(self) -> None:
        """Start the sandbox beside the first model call, where that pays (sandboxes/early.py); never raises."""
        self._sandbox.start_early(self.limits.time_left())

    @property
    def has_sandbox(self) -> bool:
        """Whether the prompt's sandbox was made (by a tool, the setup or the check) and is still there."""
        return self._sandbox.made

    @property
    def sandbox_error(self) -> SandboxError | None:
        """Why the sandbox could not be made: the environment's fault, not the model's, so the sample fails (and
        --resume retries it) instead of saving a trajectory of it."""
        return self._sandbox.error

    def ask(self, messages: list[dict], model: str) -> str:
        """A model's answer (reasoning left out) through the run's client; ModelCallError when it fails for good."""
        reply = self.client.chat(messages, model=model, deadline=self.limits.deadline)
        self.usage.add(reply.get("usage"))
        _, text = split_reasoning(_first_message(reply))
        return text.strip()

    def generate_image(self, request: dict) -> Reply:
        """One images API call through the run's client for images; its usage counts into the sample's."""
        reply = self.image_client.generate_image(request, deadline=self.limits.deadline)
        usage = reply.get("usage")
        if isinstance(usage, dict):  # the images API counts input and output tokens
            self.usage.add(
                {
                    "prompt_tokens": usage.get("input_tokens"),
                    "completion_tokens": usage.get("output_tokens"),
                    "total_tokens": usage.get("total_tokens"),
                }
            )
        return reply

    def on_cleanup(self, fn: Callable[[], None]) -> None:
        """Run fn when the sample ends, whatever the outcome (latest registered runs first)."""
        self._cleanups.append(fn)

    def close(self, interrupted: bool = False) -> None:
        """Release everything the sample made, its sandbox last; never raises. `interrupted`: it did not run to its end."""
        for fn in reversed(self._cleanups):
            try:
                fn()
            except BaseException:  # a tool's KeyboardInterrupt too: the sample's slot must go on to its end
                pass
        self._cleanups.clear()
        self._sandbox.close(interrupted)


def _first_message(reply: dict) -> dict:
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    message = first.get("message") if isinstance(first, dict) else None
    return message if isinstance(message, dict) else {}
