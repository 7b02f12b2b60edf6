"""Harbor's fixed names: the dataset format's, and where a task's tests, solution and verifier logs go in its container.

Apart from the modules that use them, so that the format and --model=oracle register at every start without
importing the task readers (task.toml, task directories, Compose), which only a run of Harbor tasks needs.
"""

from __future__ import annotations

FORMAT = "harbor"  # the dataset format's name (dataset_format.py), which --model=oracle runs (oracle.py)
TESTS_DIR, SOLUTION_DIR, VERIFIER_LOGS = "/tests", "/solution", "/logs/verifier"
