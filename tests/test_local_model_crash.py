"""The embedded model's server dying the way llama.cpp's repacked kernels make it die on some CPUs.

An Intel Xeon with AMX killed it with SIGSEGV at its first decode, a virtual machine hiding AMX with SIGILL;
this suite's machines may do neither. tests/local_model_site/sitecustomize.py, on the PYTHONPATH the runner
passes on to the server, makes the real server die so whenever the model was loaded with llama.cpp's extra
buffer types (weight repacking) on: the run must go on without them, say so in one line, and show no log.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset

SITE = Path(__file__).resolve().parent / "local_model_site"
SITE_MARKER = "sitecustomize: the simulated crash of the repacked kernels"
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"),
    pytest.mark.slow,
]


def _run(tmp_path: Path, site: str):
    """One short prompt through the real CLI and the real server; the server's logs land in tmp_path/tmp, and
    what each start gave llama.cpp in tmp_path/note.jsonl."""
    data = write_dataset(tmp_path / "ds.jsonl", ["Say hello."])
    (tmp_path / "tmp").mkdir()
    flags = [
        f"--dataset_file={data}",
        "--batch_size=1",
        "--run_name=r",
        f"--output_dir={tmp_path / 'out'}",
        "--model=local",
        "--require_reasoning=false",
        "--distribution=minimal",  # a short tool list: a short prompt for the tiny model on two busy cores
        "--max_turns=1",
        "--max_tokens=8",
    ]
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, (str(SITE), os.environ.get("PYTHONPATH")))),
        "BR_LLAMA_SITE": f"{site} note={tmp_path / 'note.jsonl'}",
        "TMPDIR": str(tmp_path / "tmp"),
    }
    return run_cli(flags, tmp_path, timeout=600, env=env)


def _repacked(tmp_path: Path) -> list[bool]:
    """use_extra_bufts of each model load, in order."""
    lines = (tmp_path / "note.jsonl").read_text().splitlines()
    return [n["use_extra_bufts"] for n in map(json.loads, lines) if "use_extra_bufts" in n]


def _no_log_shown(stderr: str) -> None:
    for piece in (SITE_MARKER, "CPU : SSE3", "llama_model_loader", "print_info", "chat_template", "Traceback"):
        assert piece not in stderr, stderr


@pytest.mark.parametrize(
    ("site", "said"),
    [
        ("crash=SIGSEGV", "was killed by SIGSEGV at its first tokens"),  # the Intel Xeon with AMX
        ("crash=SIGBUS", "was killed by SIGBUS at its first tokens"),
        ("crash=SIGABRT", "was killed by SIGABRT at its first tokens"),  # a GGML_ASSERT
        ("crash=SIGILL", "was killed by SIGILL at its first tokens"),  # a VM that reports AMX and does not run it
        ("crash=SIGSEGV at=load", "was killed by SIGSEGV while loading the model"),
    ],
)
def test_a_server_that_crashes_with_repacked_weights_runs_without_them(tmp_path, site, said):
    proc = _run(tmp_path, site)
    assert_clean_exit(proc)
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("warning: the local model server")]
    assert warnings == [
        f"warning: the local model server {said} with llama.cpp's repacked weights (the kernels of its extra "
        "buffer types, AMX or CPU_REPACK, fail on this CPU); it runs without repacking"
    ], proc.stderr
    _no_log_shown(proc.stderr)
    assert _repacked(tmp_path) == [True, False]  # started again, without repacking
    run = RunDir(tmp_path / "out" / "r")
    assert [r["metadata"]["model"] for r in run.trajectories()] == ["local"] and run.failed() == []
    assert list((tmp_path / "tmp").glob("local-model-*.log")) == []  # neither server's log outlives the run


def test_a_server_that_crashes_either_way_is_one_line_naming_its_log(tmp_path):
    proc = _run(tmp_path, "crash=SIGSEGV when=always")
    assert_clean_exit(proc, 2)
    (line,) = proc.stderr.strip().splitlines()
    logs = list((tmp_path / "tmp").glob("local-model-*.log"))
    assert len(logs) == 1, logs  # the last start's log is kept for the user; the first one's is gone
    assert line == (
        "error: the local model server could not start: it was killed by SIGSEGV at its first tokens, "
        f"with repacked weights and without; its log: {logs[0]}"
    )
    assert _repacked(tmp_path) == [True, False]
    assert SITE_MARKER in logs[0].read_text()  # the log is that server's, and stays out of the message
    _no_log_shown(proc.stderr)
    assert not (tmp_path / "out").exists()  # nothing created, as for any error before the run starts
