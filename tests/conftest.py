"""Shared fixtures (the Docker ones live in conftest_docker.py), and CI's rule that nothing is skipped."""

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from conftest_docker import compose_binary, docker_images, docker_run_name, leftover_containers  # noqa: F401

from agentbatch import plugins

# The built-in tools, backends, formats and models, and the installed plug-ins, registered as a run's start
# registers them (the registries never load anything themselves): tests read them as the runner's code does.
plugins.load()

# A suite started as a script's background job inherits SIGINT ignored, and so would every CLI it starts: the tests
# that send Ctrl-C mean a terminal's (test_interrupt starts one with it ignored on purpose). Exec sets a handled
# signal back to its default in the child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With BATCH_RUNNER_NO_SKIP=1 (set by .ci/run) a skipped test fails: CI has Docker, Chromium and llama.cpp."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("BATCH_RUNNER_NO_SKIP") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may be skipped: {report.longrepr}"


@pytest.fixture
def private_tmp():
    """A TMPDIR for one run alone (its sandbox directories, the ones it reaps, can be counted), which the sandbox's
    user may pass: no other test's leftovers, which a run's start reaps and says so, are in it."""
    path = Path(tempfile.mkdtemp(prefix="br-test-tmp-", dir="/tmp"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)
