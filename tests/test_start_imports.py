"""What a run imports before its first request: nothing of the Docker SDK unless the run uses Docker.

The docker SDK (with requests and urllib3) took ~0.1 s of every run's start, imported by the Harbor module
of the launch even for runs with no Harbor task and no container: a tenth of a second of the first second
of a rate-limited run (bench (16f)). Later the Harbor plug-in, which every run loads, brought it back through
the Compose checks of a task directory (0.15 s: bench (9)'s start 0.16 -> 0.41 s), so the plug-ins are loaded
here as a run loads them.
"""

from __future__ import annotations

import subprocess
import sys

from cli_helpers import ROOT

HEAVY = ("docker", "requests", "urllib3")


def test_a_run_without_docker_does_not_import_its_sdk():
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import batch_runner\n"
        "from agentbatch import launch, session\n"
        "from agentbatch.executors import processes\n"
        "from agentbatch.sandboxes import bwrap, local, docker\n"
        "from agentbatch import plugins\n"
        "plugins.load()\n"  # the built-ins and installed plug-ins, Harbor's dataset format and oracle among them
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"imported at start: {done.stdout.strip()}"
