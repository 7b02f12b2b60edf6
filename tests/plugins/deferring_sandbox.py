"""A plug-in backend for the tests: the local sandbox, its removal handed to closing.defer and slow (a second),
and its reap, as docker's by label, of whatever the run's sandboxes left, whoever still holds them: a marker file
per sandbox in $BR_TEST_MARKS, removed with it; removed.log there lists each removal."""

import contextlib
import os
import time
import uuid

from agentbatch.sandboxes import closing, registry
from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.sandboxes.local import LocalBackend, LocalSandbox

LOG = "removed.log"


def _marks() -> str:
    return os.environ["BR_TEST_MARKS"]


@registry.backend("deferring")
class DeferringBackend(LocalBackend):
    def create(self, spec: SandboxSpec) -> LocalSandbox:
        sandbox = LocalSandbox(spec.cwd, spec.settings.local_containment)
        sandbox.mark = os.path.join(_marks(), uuid.uuid4().hex)
        open(sandbox.mark, "w").close()
        return sandbox

    def cleanup(self, sandbox: LocalSandbox, interrupted: bool) -> None:
        def remove() -> None:
            time.sleep(1)
            sandbox.cleanup()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sandbox.mark)
            with open(os.path.join(_marks(), LOG), "a") as f:
                f.write(os.path.basename(sandbox.mark) + "\n")

        closing.defer(remove)

    def reap(self, labels: dict[str, str]) -> int:
        left = [name for name in os.listdir(_marks()) if name != LOG]
        for name in left:
            os.unlink(os.path.join(_marks(), name))
        return len(left)

    def reaped(self, n: int, whose: str) -> str:
        return f"removed {n} deferring sandboxes {whose}"
