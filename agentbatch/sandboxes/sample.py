"""One sample's sandbox from its first use (or beside its first model call) to its end: made by its backend under a
start permit, removed by it."""

from __future__ import annotations

import logging

from agentbatch.sandboxes import early, registry
from agentbatch.sandboxes.base import Backend, Sandbox, SandboxError, SandboxSpec
from agentbatch.sandboxes.starts import start_permit

log = logging.getLogger(__name__)


class SampleSandbox:
    """The sandbox of one sample: created on first use, cleaned up by close(), through the spec's backend."""

    def __init__(self, spec: SandboxSpec):
        self.spec = spec
        self.backend: Backend = registry.get(spec.kind)
        # Why the sandbox could not be made: the environment's fault, not the model's.
        self.error: SandboxError | None = None
        self._sandbox: Sandbox | None = None
        self._could_start_early = False  # start_early was asked: the sample's end teaches early.policy
        # A paced backend's creations share --sandbox_starts permits; 0: none to wait for.
        self._permits = spec.settings.starts if self.backend.paced else 0

    @property
    def made(self) -> bool:
        """Whether the sandbox exists now (made at a first use, not yet removed)."""
        return self._sandbox is not None

    def get(self, time_left: float | None = None) -> Sandbox:
        """The sandbox, created now if need be once a start permit is free; TimeoutError if `time_left` passes first."""
        if self._sandbox is None:
            with start_permit(self._permits, time_left) as started:
                if not started:
                    raise TimeoutError("the sample's time limit came while its sandbox waited to start")
                try:
                    self._sandbox = self.backend.create(self.spec)
                except SandboxError as e:
                    self.error = self.error or e
                    raise
        return self._sandbox

    def start_early(self, time_left: float | None = None) -> None:
        """Beside the sample's first model call: make the sandbox and start what its first command needs, without
        waiting for it, where the backend warms and this worker's samples have been running commands (early.py).
        Waits only for a start permit, as a first use would (a warming backend's `create` is quick); never raises:
        what fails here is tried again, and said, at the first use."""
        if not self.backend.warms or self._sandbox is not None:
            return
        self._could_start_early = True
        if not early.policy.want():
            return
        with start_permit(self._permits, time_left) as started:
            if not started:
                return
            try:
                self._sandbox = self.backend.create(self.spec)
            except (SandboxError, OSError):
                return
        self.backend.warm(self._sandbox)

    def close(self, interrupted: bool = False) -> None:
        """Remove the sandbox, if one was made, and everything running in it; never raises."""
        sandbox, self._sandbox = self._sandbox, None
        if self._could_start_early:
            self._could_start_early = False
            ran = self.backend.ran_commands(sandbox) if sandbox is not None else False
            if ran is not None:
                early.policy.learn(ran)
        if sandbox is not None:
            try:
                self.backend.cleanup(sandbox, interrupted)
            except Exception as e:  # a backend's bug; what it left, its reap removes
                log.warning(
                    "the %s backend failed to clean up a sandbox: %s: %s", self.backend.name, type(e).__name__, e
                )
