"""What a run imports before its first request: nothing of the Docker SDK unless the run uses Docker, nothing of
Harbor's task readers unless it runs Harbor tasks.

The docker SDK (with requests and urllib3) took ~0.1 s of every run's start, imported by the Harbor module
of the launch even for runs with no Harbor task and no container: a tenth of a second of the first second
of a rate-limited run (bench (16f)). Later the Harbor plug-in, which every run loads, brought it back through
the Compose checks of a task directory (0.15 s: bench (9)'s start 0.16 -> 0.41 s), so the plug-ins are loaded
here as a run loads them. The Harbor format and --model=oracle, which register at every start, imported every
task reader with them (task.toml's typed fields, tomllib, the Compose checks, the runner's steps): ~20 ms of
CPU of every start.
"""

from __future__ import annotations

import subprocess
import sys

from cli_helpers import ROOT

HEAVY = ("docker", "requests", "urllib3")
HARBOR_READERS = ("agentbatch.harbor.task_config", "agentbatch.harbor.task_dir", "agentbatch.harbor.run", "tomllib")


def imported_at_start(names: tuple[str, ...]) -> list[str]:
    """Which of `names` a fresh interpreter has imported once it has what a run's start imports."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import batch_runner\n"
        "from agentbatch import launch, session\n"
        "from agentbatch.executors import processes\n"
        "from agentbatch.sandboxes import bwrap, local, docker\n"
        "from agentbatch import plugins\n"
        "plugins.load()\n"  # the built-ins and installed plug-ins, Harbor's dataset format and oracle among them
        f"print(' '.join(m for m in {names!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_a_run_without_docker_does_not_import_its_sdk():
    assert imported_at_start(HEAVY) == []


def test_a_run_without_harbor_tasks_does_not_import_their_readers():
    assert imported_at_start(HARBOR_READERS) == []
