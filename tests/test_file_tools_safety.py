"""What broke when a run was attacked on purpose (issue 18, the sandbox and file-tool cases), through the CLI.

A model's search path that looks like an option, a FIFO, /dev/zero or a 4 GB file to read, a hard link
or a racing symlink to write through, a row whose cwd is `/`, host files it should not read, and output
without end: each is refused or bounded, and the run goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, cli_command, cli_env, run_cli, write_dataset
from helpers import make_ctx
from sandbox_support import PeakTreeMemory, settings_for
from scripted_server import ScriptedServer

from agentbatch.sandboxes.base import SandboxSpec
from agentbatch.tools.registry import call_tool, load_tools
from agentbatch.tools.settings import ToolSettings

MIB = 1024**2


def call(name: str, **args) -> dict:
    return {"tool_calls": [{"name": name, "arguments": args}]}


def cli_args(tmp_path: Path, rows, *flags: str) -> list[str]:
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    args = [f"--dataset_file={data}", "--batch_size=10", "--run_name=attack", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    return [*args, "--max_turns=12", *flags]


def run(tmp_path: Path, rows, script: dict, *flags: str, timeout: float = 120):
    with ScriptedServer(script=script) as srv:
        proc = run_cli(cli_args(tmp_path, rows, *flags), tmp_path, srv, timeout=timeout)
    return proc, RunDir(tmp_path / "out" / "attack")


def run_measured(tmp_path: Path, rows, script: dict, *flags: str) -> tuple[subprocess.CompletedProcess, RunDir, int]:
    """The run, and the peak memory of the runner with all its processes."""
    with ScriptedServer(script=script) as srv:
        proc = subprocess.Popen(
            cli_command(cli_args(tmp_path, rows, *flags), srv),
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with PeakTreeMemory(proc.pid) as memory:
            out, err = proc.communicate(timeout=180)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, RunDir(tmp_path / "out" / "attack"), memory.peak


def results(record: dict) -> list[dict]:
    return [json.loads(t["value"]) for t in record["conversations"] if t["from"] == "tool"]


@pytest.fixture
def project(tmp_path) -> Path:
    """A real project directory a row's cwd points at."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("# TODO: ship it\nprint('hi')\n")
    (root / "README").write_text("TODO: docs\n")
    return root


def project_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_a_search_path_is_never_an_option(tmp_path, project, sandbox):
    if sandbox == "bwrap":
        settings_for("bwrap")
    before = project_files(project)
    script = {
        "search": [
            call("search_files", pattern="TODO", path="-delete"),
            call("search_files", pattern="TODO", path="-exec"),
            call("search_files", pattern="TODO", path="--help"),
            call("search_files", pattern="-delete", file_glob="-delete"),
            call("search_files", pattern="TODO"),
            {"content": "searched"},
        ]
    }
    rows = [{"prompt": "search", "cwd": str(project)}]
    proc, run_dir = run(tmp_path, rows, script, f"--sandbox={sandbox}")
    assert_clean_exit(proc)
    assert project_files(project) == before, "a search deleted files"
    *odd, last = results(run_dir.trajectories()[0])
    assert all(r["count"] == 0 for r in odd), odd
    if sandbox == "local":
        assert sorted(last["matches"]) == ["./README:1:TODO: docs", "./src/main.py:1:# TODO: ship it"]


def test_fifos_devices_and_huge_files_are_refused_or_capped(tmp_path, project):
    os.mkfifo(project / "pipe")
    with open(project / "huge.bin", "wb") as f:
        f.truncate(4 * 1024**3)  # 4 GB, sparse
    (project / "big.txt").write_bytes(b"x" * (9 * MIB))
    os.symlink("/dev/zero", project / "zero")
    script = {
        "read": [
            call("read_file", path="pipe"),
            call("read_file", path="/dev/zero"),
            call("read_file", path="zero"),
            call("read_file", path="huge.bin"),
            call("patch", path="big.txt", old_string="x", new_string="y", replace_all=True),
            call("write_file", path="pipe", content="x"),
            {"content": "done"},
        ]
    }
    start = time.monotonic()
    proc, run_dir, peak = run_measured(tmp_path, [{"prompt": "read", "cwd": str(project)}], script, "--sandbox=local")
    assert_clean_exit(proc)
    assert time.monotonic() - start < 60
    fifo, zero, link, huge, patch, write = results(run_dir.trajectories()[0])
    assert "not a regular file" in fifo["error"]
    assert "only inside" in zero["error"]
    assert "symbolic link" in link["error"]
    assert huge["error"] is None and huge["total_lines"] == 1  # the first 1,000,000 bytes, no more
    assert "over 8388608 bytes" in patch["error"]
    assert "not a regular file" in write["error"]
    assert peak < 600 * MIB, f"the runner's processes peaked at {peak / MIB:.0f} MiB"
    assert (project / "big.txt").read_bytes() == b"x" * (9 * MIB)


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_output_without_end_costs_a_few_mib(tmp_path, sandbox):
    if sandbox == "bwrap":
        settings_for("bwrap")
    script = {
        "yes": [call("terminal", command="yes"), {"content": "done"}],
        "flood": [
            call("terminal", command="head -c 50000000 /dev/zero | tr '\\0' x; echo; echo END"),
            {"content": "d"},
        ],
    }
    flags = (f"--sandbox={sandbox}", "--command_timeout=6", "--concurrency=2")
    proc, run_dir, peak = run_measured(tmp_path, list(script), script, *flags)
    assert_clean_exit(proc)
    records = {r["conversations"][0]["value"]: results(r)[0] for r in run_dir.trajectories()}
    assert "timed out" in records["yes"]["error"]
    assert records["flood"]["output"].endswith("END\n") and "characters cut" in records["flood"]["output"]
    assert peak < 600 * MIB, f"the runner's processes peaked at {peak / MIB:.0f} MiB"


def test_no_write_through_a_hard_link(tmp_path, project):
    outside = tmp_path / "host-file.txt"
    outside.write_text("belongs to the host\n")
    os.link(outside, project / "linked.txt")
    script = {
        "link": [
            call("write_file", path="linked.txt", content="overwritten"),
            call("patch", path="linked.txt", old_string="host", new_string="model"),
            {"content": "done"},
        ]
    }
    proc, run_dir = run(tmp_path, [{"prompt": "link", "cwd": str(project)}], script, "--sandbox=local")
    assert_clean_exit(proc)
    write, patch = results(run_dir.trajectories()[0])
    assert "2 hard links" in write["error"] and "2 hard links" in patch["error"]
    assert outside.read_text() == "belongs to the host\n"


RACER = """
import os, sys
target, outside = sys.argv[1], os.path.join(sys.argv[2], "f.txt")
link, plain = target + ".link", target + ".plain"
while True:  # the file is a link to outside/f.txt, then a plain file again, swapped atomically
    os.symlink(outside, link)
    os.rename(link, target)
    open(plain, "w").close()
    os.rename(plain, target)
"""


def test_a_symlink_swapped_in_during_writes_never_leads_outside(tmp_path, project):
    """The check-then-open race: another process swaps a link to outside/ in and out, 3,000 writes."""
    import sys

    outside = tmp_path / "outside"
    outside.mkdir()
    target = project / "f.txt"
    target.write_text("")
    racer = subprocess.Popen([sys.executable, "-c", RACER, str(target), str(outside)])
    load_tools()
    ctx = make_ctx(ToolSettings(), SandboxSpec(cwd=str(project)))
    write = load_tools()["write_file"]
    try:
        outcomes = [call_tool(write, json.dumps({"path": "f.txt", "content": str(i)}), ctx)[1] for i in range(3000)]
    finally:
        racer.kill()
        racer.wait()
        ctx.close()
    assert list(outside.iterdir()) == [], "a write went through the swapped-in link"
    assert any(outcomes) and not all(outcomes)  # the race really happened: some writes met the link


@pytest.mark.parametrize("sandbox", ["local", "bwrap"])
def test_a_cwd_of_slash_gets_writes_not_contradictions(tmp_path, sandbox):
    if sandbox == "bwrap":
        settings_for("bwrap")
    target = tmp_path / "written-from-slash" / "x.txt"
    script = {
        "slash": [
            call("write_file", path=str(target), content="hello\n"),
            call("read_file", path=str(target)),
            call("terminal", command="pwd"),
            {"content": "done"},
        ]
    }
    proc, run_dir = run(tmp_path, [{"prompt": "slash", "cwd": "/"}], script, f"--sandbox={sandbox}")
    assert_clean_exit(proc)
    write, read, shell = results(run_dir.trajectories()[0])
    assert write["error"] is None and read["content"] == "hello\n" and shell["output"] == "/\n"
    # Local: the row asked for the machine's root and gets it; bwrap: a root of the sandbox's own.
    assert target.exists() == (sandbox == "local")


def test_the_file_tools_read_only_inside_the_prompts_directories(tmp_path, project):
    script = {
        "peek": [
            call("read_file", path="/etc/shadow"),
            call("read_file", path="../../../../../etc/passwd"),
            call("search_files", pattern="root", path="/etc"),
            call("search_files", pattern="root", path=".."),
            call("read_file", path="src/main.py"),
            {"content": "done"},
        ]
    }
    rows = [{"prompt": "peek", "cwd": str(project)}]
    proc, run_dir = run(tmp_path, rows, script, "--sandbox=local", "--distribution=terminal_only")
    assert_clean_exit(proc)
    *refused, allowed = results(run_dir.trajectories()[0])
    assert all("only inside" in r["error"] for r in refused), refused
    assert allowed["content"].startswith("# TODO")
    assert "root:" not in json.dumps(refused)


def test_a_search_never_follows_a_symlink_out_of_the_prompts_directory(tmp_path, project):
    """`ln -s /etc etc`, then `etc/.` or `etc/`: what the search is handed is the path that was checked."""
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "shadow").write_text("root:TOPSECRET:0\n")
    (project / "src" / "notes.txt").write_text("no TOPSECRET here, only its name\n")
    script = {
        "escape": [
            call("terminal", command=f"ln -s {outside} etc && ln -s {outside} src/rootdir"),
            *[call("search_files", pattern="root:TOPSECRET", path=p) for p in ESCAPES],
            call("search_files", pattern="TOPSECRET", path="src/."),
            {"content": "done"},
        ]
    }
    rows = [{"prompt": "escape", "cwd": str(project)}]
    proc, run_dir = run(tmp_path, rows, script, "--sandbox=local", "--distribution=terminal_only")
    assert_clean_exit(proc)
    _, *escapes, inside = results(run_dir.trajectories()[0])
    assert "root:TOPSECRET" not in json.dumps(escapes), escapes
    assert all("symbolic link" in r["error"] for r in escapes if r.get("error")), escapes
    # A search below the directory still works, and finds nothing behind the link it meets on the way.
    assert inside["matches"] == ["src/notes.txt:1:no TOPSECRET here, only its name"], inside


ESCAPES = ["etc/.", "etc/", "etc", "./etc/./", "src/../etc/.", "etc/deep", "src/rootdir/.", "src/rootdir/deep/."]
