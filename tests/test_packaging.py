"""What `pip install .` puts in site-packages: the three modules the project is known by and one package."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"batch_runner.py", "toolset_distributions.py", "trajectory.py", "agentbatch"}
NOT_SOURCE = shutil.ignore_patterns(".git", "data", "out", "build", "*.egg-info", "__pycache__", ".*_cache")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """`pip install .` of a copy of the checkout into a target directory (the build's leftovers stay in the copy)."""
    tmp = tmp_path_factory.mktemp("install")
    source, target = tmp / "source", tmp / "site"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*command, "--target", str(target), "."], cwd=source, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return target


def test_an_install_adds_three_modules_and_one_package(installed):
    top = {p.name for p in installed.iterdir()} - {"bin", "__pycache__"}
    metadata = {n for n in top if n.endswith(".dist-info")}
    assert top - metadata == OURS
    in_site = {str(p.relative_to(installed)) for p in (installed / "agentbatch").rglob("*.py")}
    in_checkout = {str(p.relative_to(ROOT)) for p in (ROOT / "agentbatch").rglob("*.py")}
    assert in_site == in_checkout, "every module of the package is installed, and nothing else"
    assert not any("scripted_server" in name or "scripted_handler" in name for name in in_site), (
        "the scripted test server is not part of the runtime"
    )


def test_the_installed_console_script_runs(installed, tmp_path):
    # Run from outside the checkout, so only the installed copy can be imported.
    code = (
        "import agentbatch, batch_runner, sys; print(agentbatch.__file__, batch_runner.__file__); "
        "sys.argv = ['batch-runner', '--list_distributions']; batch_runner.cli()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    assert all(path.startswith(str(installed)) for path in first.split()), first
    assert "terminal_tasks" in rest
