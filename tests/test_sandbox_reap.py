"""A dead worker's sandbox directories are reaped, also while the worker is a zombie nobody has reaped yet.

A runner killed with kill -9 leaves its workers to the machine's init, which may be slow to reap them: until
then each is a zombie, dead, and what it owned is a leftover for the next session's reap.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cli_helpers import ROOT
from sandbox_support import alive


def test_a_dead_worker_is_dead_while_it_waits_to_be_reaped(tmp_path):
    """A killed runner's workers are the machine's init's to reap, which may be slow: a zombie owns nothing."""
    from agentbatch.sandboxes import sandbox_dirs

    code = "import sys, time; sys.path.insert(0, sys.argv[1])\nfrom agentbatch.sandboxes import sandbox_dirs\n"
    code += "print(sandbox_dirs.make(), flush=True)\nsys.stdin.read()\n"
    worker = subprocess.Popen(
        [sys.executable, "-c", code, str(ROOT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    name = os.path.basename(worker.stdout.readline().strip())
    try:
        assert sandbox_dirs.owner_alive(name)
        worker.stdin.close()  # it exits, and stays a zombie: nobody has waited for it yet
        deadline = time.monotonic() + 30
        while alive(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(f"/proc/{worker.pid}") and not sandbox_dirs.owner_alive(name)
    finally:
        worker.wait()
