"""What `pip install .` puts in site-packages: the three modules the project is known by and one package."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = {"batch_runner.py", "toolset_distributions.py", "trajectory.py", "agentbatch"}


def test_an_install_adds_three_modules_and_one_package(tmp_path):
    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            ".",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    top = {p.name for p in target.iterdir()} - {"bin", "__pycache__"}
    metadata = {n for n in top if n.endswith(".dist-info")}
    assert top - metadata == OURS
    installed = {str(p.relative_to(target)) for p in (target / "agentbatch").rglob("*.py")}
    in_checkout = {str(p.relative_to(ROOT)) for p in (ROOT / "agentbatch").rglob("*.py")}
    assert installed == in_checkout, "every module of the package is installed, and nothing else"
    assert not any("scripted" in name for name in installed), "the scripted test server is not part of the runtime"


def test_the_installed_console_script_runs(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            ".",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    # Run from outside the checkout, so only the installed copy can be imported.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import batch_runner, sys; sys.argv = ['batch-runner', '--list_distributions']; batch_runner.cli()",
        ],
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "terminal_tasks" in done.stdout
