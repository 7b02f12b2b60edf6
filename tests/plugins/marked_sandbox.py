"""A plug-in sandbox backend for the tests: the local sandbox under another name, its commands marked."""

from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import SandboxSettings, SandboxSpec
from agentbatch.sandboxes.local import LocalBackend, LocalSandbox


class MarkedSandbox(LocalSandbox):
    def exec(self, command: str, timeout: float):
        return super().exec(f"export SANDBOX_KIND=marked; {command}", timeout)


@registry.backend("marked")
class MarkedBackend(LocalBackend):
    def prepare_run(self, settings: SandboxSettings) -> str:
        return "sandbox: marked (a plug-in's)"

    def create(self, spec: SandboxSpec) -> MarkedSandbox:
        return MarkedSandbox(spec.cwd, spec.settings.local_containment)
