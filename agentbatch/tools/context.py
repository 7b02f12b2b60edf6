"""What one prompt's tools share: its sandbox, the model client, the settings, its usage and its cleanups."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentbatch import sandboxes
from agentbatch.limits import SessionLimits
from agentbatch.model.base import Model, Reply
from agentbatch.model.reasoning import split_reasoning
from agentbatch.model.usage import Usage
from agentbatch.sandboxes.base import Sandbox, SandboxError, SandboxSpec
from agentbatch.sandboxes.starts import start_slot
from agentbatch.tools.settings import ToolSettings


class ToolContext:
    """One prompt's tool state; the sandbox is made on first use and everything is released by close()."""

    def __init__(
        self,
        settings: ToolSettings,
        spec: SandboxSpec,
        client: Model,
        usage: Usage | None = None,
        image_client: Model | None = None,
        limits: SessionLimits | None = None,
        redact: Callable[[str], str] | None = None,
    ):
        self.settings = settings
        # Applied to every tool result before the endpoint sees it (secrets_guard.Redactor).
        self.redact = redact or (lambda text: text)
        self.spec = spec
        self.client = client
        self.image_client = image_client or client
        self.usage = usage if usage is not None else Usage()
        # The session's deadline and token/cost limits; commands and model calls are cut at the deadline.
        self.limits = limits or SessionLimits(usage=self.usage)
        self.resources: dict[str, Any] = {}
        # Why the sandbox could not be made: the environment's fault, not the model's, so the prompt fails
        # (and --resume retries it) instead of saving a trajectory of it.
        self.sandbox_error: SandboxError | None = None
        self._sandbox: Sandbox | None = None
        self._cleanups: list[Callable[[], None]] = []

    def sandbox(self) -> Sandbox:
        """The prompt's sandbox, created on first use."""
        if self._sandbox is None:
            with start_slot(self.spec.settings.starts, self.limits.time_left()) as started:
                if not started:  # the prompt's time is up: the loop ends it as "time", not as a failure
                    raise TimeoutError("the prompt's time limit came while its sandbox waited to start")
                try:
                    self._sandbox = sandboxes.create(self.spec)
                except SandboxError as e:
                    self.sandbox_error = self.sandbox_error or e
                    raise
        return self._sandbox

    def ask(self, messages: list[dict], model: str) -> str:
        """A model's answer (reasoning left out) through the run's client; ModelCallError when it fails for good."""
        reply = self.client.chat(messages, model=model, deadline=self.limits.deadline)
        self.usage.add(reply.get("usage"))
        _, text = split_reasoning(_first_message(reply))
        return text.strip()

    def generate_image(self, request: dict) -> Reply:
        """One images API call through the run's client for images; its usage counts into the prompt's."""
        reply = self.image_client.generate_image(request)
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
        """Run fn when the prompt ends, whatever the outcome (latest registered runs first)."""
        self._cleanups.append(fn)

    def close(self) -> None:
        """Release everything the prompt made; never raises."""
        for fn in reversed(self._cleanups):
            try:
                fn()
            except Exception:
                pass
        self._cleanups.clear()
        if self._sandbox is not None:
            try:
                self._sandbox.cleanup()
            finally:
                self._sandbox = None


def _first_message(reply: dict) -> dict:
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else {}
    message = first.get("message") if isinstance(first, dict) else None
    return message if isinstance(message, dict) else {}
