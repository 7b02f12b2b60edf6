"""The bwrap sandbox through the real CLI: chosen by default, isolated, limited, and cleaned up after.

A model that probes its sandbox sees only its own processes, none of the runner's /proc, no key by any
path, and cannot write outside its own directories; a fork bomb and a memory bomb end their own prompt's
command only; --sandbox_network=none cuts the network; a dead worker's and a double-Ctrl-C'd session's
sandboxes are gone after the run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from cli_helpers import RunDir, assert_clean_exit, run_cli, start_cli, write_dataset
from fake_site import FakeSite
from sandbox_support import new_marker, pids_with, sandbox_dirs_in, settings_for, wait_gone
from scripted_server import ScriptedServer

from agentbatch.sandboxes import sandbox_dirs


@pytest.fixture(autouse=True)
def needs_bwrap():
    settings_for("bwrap")  # skips (a failure in CI) where bwrap cannot run


def call(name: str, **args) -> dict:
    return {"tool_calls": [{"name": name, "arguments": args}]}


def terminal(command: str) -> dict:
    return call("terminal", command=command)


def run(tmp_path: Path, rows, script: dict, *flags: str, env: dict | None = None, name: str = "box"):
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    args = [f"--dataset_file={data}", "--batch_size=10", f"--run_name={name}", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    args += ["--concurrency=4", *flags]
    with ScriptedServer(script=script) as srv:
        proc = run_cli(args, tmp_path, srv, env=env)
    return proc, RunDir(tmp_path / "out" / name)


def results(record: dict) -> list[dict]:
    return [json.loads(t["value"]) for t in record["conversations"] if t["from"] == "tool"]


def by_prompt(run_dir: RunDir) -> dict[str, dict]:
    return {r["conversations"][0]["value"]: r for r in run_dir.trajectories()}


def test_bwrap_is_the_default_where_it_works_and_terminal_env_names_it(tmp_path, private_tmp):
    script = {"who": [terminal("id -un; pwd; hostname"), {"content": "done"}]}
    alone = {"TMPDIR": str(private_tmp)}  # no other test's leftovers to reap and say so before the note
    for how, flags, env in (
        ("default", [], alone),
        ("env", [], {**alone, "TERMINAL_ENV": "bwrap"}),
        ("flag", ["--sandbox=bwrap"], alone),
    ):
        proc, run_dir = run(tmp_path / how, ["who"], script, *flags, env=env)
        assert_clean_exit(proc)
        assert proc.stderr.splitlines()[0].startswith("sandbox: bwrap ("), proc.stderr
        (result,) = results(run_dir.trajectories()[0])
        user = "nobody" if os.geteuid() == 0 else os.environ.get("USER", "")
        assert result["output"].splitlines()[0] == user or os.geteuid() != 0
        assert result["output"].splitlines()[1:] == ["/workspace", "sandbox"], result


def test_explicit_local_says_it_is_no_isolation_boundary(tmp_path, private_tmp):
    proc, _ = run(tmp_path, ["hi"], {"hi": {"content": "done"}}, "--sandbox=local", env={"TMPDIR": str(private_tmp)})
    assert_clean_exit(proc)
    note = proc.stderr.splitlines()[0]
    assert note.startswith("warning: sandbox: local") and "not an isolation boundary" in note, note


def test_a_probing_model_finds_no_runner_no_key_and_no_way_out(tmp_path):
    secret = f"sk-or-BOXSECRET{uuid.uuid4().hex}"
    canary = tmp_path / "canary.txt"
    canary.write_text("host file\n")
    outside = tmp_path / "outside"
    outside.mkdir()

    def probing(host_pids: list[int]) -> list[dict]:
        probes = [
            "ps -eo pid,args --no-headers",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; "
            "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' ' '",
            " ; ".join(f"cat /proc/{p}/cmdline /proc/{p}/environ /proc/{p}/mem 2>&1 | head -c 300" for p in host_pids),
            "env; cat /proc/self/environ | tr '\\0' '\\n'",
            f"echo x > {canary}; echo x >> ../{canary.name}; ls {tmp_path} 2>&1; echo y > /etc/evil; touch /root/x",
            f"ln -s {canary} link; echo x > link; ln {canary} hard; ln /etc/hostname hard2; echo done",
            f"cd /tmp && ln -s {outside} out && echo x > out/escaped; echo done",
        ]
        return [
            terminal("true"),
            *[terminal(c) for c in probes],
            call("write_file", path=str(canary), content="overwritten"),
            call("write_file", path="../../../.." + str(canary), content="overwritten"),
            call("write_file", path="link", content="overwritten"),
            call("write_file", path="/tmp/out/escaped", content="overwritten"),
            call("write_file", path="/etc/evil", content="x"),
            call("read_file", path="/etc/shadow"),
            call("read_file", path=f"/proc/{host_pids[0]}/environ"),
            {"content": "probed"},
        ]

    data = write_dataset(tmp_path / "ds.jsonl", ["probe"])
    args = [f"--dataset_file={data}", "--batch_size=10", "--run_name=box", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    args += [f"--api_key={secret}", "--max_turns=20"]
    with ScriptedServer(script={"probe": probing([os.getpid()])}) as srv:
        runner = start_cli(args, tmp_path, srv, env={"OPENROUTER_API_KEY": secret})
        # The probes aim at the runner itself; the script is read per request, and the first reply
        # (the same either way) comes long before the runner's workers could ask for the second.
        srv.script["probe"] = probing([runner.pid, os.getpid()])
        stdout, stderr = runner.communicate(timeout=180)
    proc = subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr)
    assert_clean_exit(proc)
    run_dir = RunDir(tmp_path / "out" / "box")
    out = results(run_dir.trajectories()[0])[1:]
    seen = json.dumps(out)
    assert secret not in seen and "BOXSECRET" not in seen
    processes = out[0]["output"] + out[1]["output"]
    assert "batch_runner" not in processes and "pytest" not in processes and "python" not in processes
    # Only the sandbox's own processes, with its own small PIDs.
    pids = [int(line.split()[0]) for line in out[0]["output"].splitlines()]
    assert max(pids) < 50 and len(pids) < 10, out[0]["output"]
    for pid in (runner.pid, os.getpid()):  # the runner's /proc, and this test's, are not there at all
        assert f"cat: /proc/{pid}/environ: No such file" in out[2]["output"], out[2]["output"]
    assert "root:" not in out[2]["output"]
    assert "PATH=" in out[3]["output"]
    assert canary.read_text() == "host file\n" and list(outside.iterdir()) == []
    assert "Read-only file system" in out[4]["output"]
    writes = out[7:12]
    assert writes[0]["error"] is None  # the path exists only inside: the sandbox's own /tmp
    assert writes[1]["error"] is None and writes[2]["error"] is None  # likewise, and through the dangling link
    assert "File exists" in writes[3]["error"]  # /tmp/out is a link to nowhere inside
    assert "Read-only" in writes[4]["error"]
    assert out[-2]["error"] and "permission denied" in out[-2]["error"].lower()
    assert out[-1]["error"]
    assert canary.read_text() == "host file\n" and list(outside.iterdir()) == []


def test_bombs_end_their_own_command_and_the_run_goes_on(tmp_path):
    script = {
        "fork bomb": [terminal("b() { b | b & }; b; sleep 2; echo survived"), {"content": "bombed"}],
        "memory bomb": [terminal("python3 -c 'x = bytearray(8 * 1024**3)'; echo exit=$?"), {"content": "bombed"}],
        "honest work": [terminal("seq 3 | paste -sd+ | bc 2>/dev/null || echo 6"), {"content": "6"}],
    }
    flags = ("--sandbox_processes=64", "--sandbox_memory=512m", "--command_timeout=6", "--concurrency=3")
    proc, run_dir = run(tmp_path, list(script), script, *flags)
    assert_clean_exit(proc)
    records = by_prompt(run_dir)
    assert set(records) == set(script) and run_dir.stats()["prompts"]["done"] == 3
    (fork,) = results(records["fork bomb"])
    assert "Resource temporarily unavailable" in fork["output"] or fork["error"], fork
    (memory,) = results(records["memory bomb"])
    assert "MemoryError" in memory["output"] and "exit=1" in memory["output"], memory
    (honest,) = results(records["honest work"])
    assert honest["output"].strip() == "6" and honest["exit_code"] == 0


def test_no_network_cuts_it_and_the_default_keeps_it(tmp_path, private_tmp):
    site = FakeSite({"/ping": lambda seen: (200, {"Content-Type": "text/plain"}, b"pong")})
    try:
        fetch = f"python3 -c \"import urllib.request as u; print(u.urlopen('{site.url}/ping', timeout=5).read())\""
        script = {"net": [terminal(f"{fetch} 2>&1 | tail -n 1"), {"content": "done"}]}
        on, on_dir = run(tmp_path / "on", ["net"], script)
        alone = {"TMPDIR": str(private_tmp)}  # the note is the first line: no other test's leftovers reaped
        off, off_dir = run(tmp_path / "off", ["net"], script, "--sandbox_network=none", env=alone)
    finally:
        site.close()
    assert_clean_exit(on)
    assert_clean_exit(off)
    assert results(on_dir.trajectories()[0])[0]["output"] == "b'pong'\n"
    assert "pong" not in results(off_dir.trajectories()[0])[0]["output"]
    assert "no network" in off.stderr.splitlines()[0]


def test_a_rows_cwd_is_a_path_inside_and_slash_works(tmp_path):
    rows = [
        {"prompt": "at root", "cwd": "/"},
        {"prompt": "deep", "cwd": "/srv/project/src"},
        {"prompt": "in usr", "cwd": "/usr/no-such-dir-here"},
    ]
    script = {
        "at root": [
            call("write_file", path="note.txt", content="at the root\n"),
            terminal("pwd; cat /note.txt; ls /usr/bin/env"),
            call("read_file", path="/note.txt"),
            {"content": "done"},
        ],
        "deep": [terminal("pwd; echo kept > f"), call("read_file", path="/srv/project/src/f"), {"content": "done"}],
    }
    proc, run_dir = run(tmp_path, rows, script)
    assert proc.returncode == 3, proc.stderr  # the row in /usr fails
    records = by_prompt(run_dir)
    write, shell, read = results(records["at root"])
    assert write["error"] is None and read["content"] == "at the root\n"
    assert shell["output"] == "/\nat the root\n/usr/bin/env\n"
    assert [r.get("output") or r.get("content") for r in results(records["deep"])] == ["/srv/project/src\n", "kept\n"]
    (failed,) = run_dir.failed()
    assert failed["prompt"] == "in usr" and "read-only in the bwrap sandbox" in failed["error"]
    assert failed["usage"]["total_tokens"] == 0  # refused before any model call
    assert not Path("/srv/project").exists()


def test_the_files_are_what_the_trajectory_says(tmp_path):
    script = {
        "files": [
            call("write_file", path="a/b.txt", content="one\ntwo\n"),
            call("patch", path="a/b.txt", old_string="two", new_string="zwei"),
            terminal("cat a/b.txt; echo three >> a/b.txt; ls -l a | wc -l"),
            call("read_file", path="a/b.txt"),
            call("search_files", pattern="zwei"),
            {"content": "done"},
        ]
    }
    proc, run_dir = run(tmp_path, ["files"], script)
    assert_clean_exit(proc)
    write, patch, shell, read, search = results(run_dir.trajectories()[0])
    assert write["bytes_written"] == 8 and patch["replacements"] == 1
    assert shell["output"] == "one\nzwei\n2\n"
    assert read["content"] == "one\nzwei\nthree\n" and search["matches"] == ["./a/b.txt:2:zwei"]


@pytest.mark.parametrize("sandbox", ["bwrap", "local"])
def test_a_dead_workers_sandboxes_are_cleaned_by_the_parent(tmp_path, sandbox, private_tmp):
    marker = new_marker()
    script = {
        "doomed": [
            terminal(f"sleep {marker}1 & setsid sleep {marker}2 > /dev/null 2>&1 & sleep {marker}3"),
            {"content": "x"},
        ],
    }
    data = write_dataset(tmp_path / "ds.jsonl", ["doomed"])
    args = [f"--dataset_file={data}", "--batch_size=10", "--run_name=dead", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=1"]
    args += [f"--sandbox={sandbox}", "--command_timeout=120", "--max_retries=0"]
    with ScriptedServer(script=script) as srv:
        proc = start_cli(args, tmp_path, srv, env={"TMPDIR": str(private_tmp)})
        try:
            deadline = time.monotonic() + 60
            while len(pids_with(f"{marker}3")) == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pids_with(marker) and sandbox_dirs_in(private_tmp), "the command never started"
            worker = _worker_of(proc.pid)
            os.kill(worker, signal.SIGKILL)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 3, err
    assert "worker process died" in RunDir(tmp_path / "out" / "dead").failed()[0]["error"]
    assert wait_gone(marker, 1.0) == []
    assert sandbox_dirs_in(private_tmp) == []


def _worker_of(runner: int) -> int:
    """The runner's worker process (forked, and named br-worker; or spawned, with multiprocessing's command line)."""
    import psutil

    for child in psutil.Process(runner).children():
        cmd = " ".join(child.cmdline())
        if child.name() == "br-worker" or ("multiprocessing" in cmd and "resource_tracker" not in cmd):
            return child.pid
    raise AssertionError("no worker process found")


@pytest.mark.parametrize("sandbox", ["bwrap", "local"])
def test_a_double_ctrl_c_leaves_no_sandbox_behind(tmp_path, sandbox, private_tmp):
    marker = new_marker()
    script = {
        f"p{i}": [terminal(f"setsid sleep {marker}{i} > /dev/null 2>&1 & sleep {marker}9{i}"), {"content": "x"}]
        for i in range(3)
    }
    data = write_dataset(tmp_path / "ds.jsonl", list(script))
    args = [f"--dataset_file={data}", "--batch_size=10", "--run_name=ctrlc", f"--output_dir={tmp_path / 'out'}"]
    args += ["--model=m", "--require_reasoning=false", "--distribution=terminal_only", "--num_workers=2"]
    args += ["--concurrency=3", f"--sandbox={sandbox}", "--command_timeout=120"]
    with ScriptedServer(script=script) as srv:
        proc = start_cli(args, tmp_path, srv, env={"TMPDIR": str(private_tmp)})
        try:
            deadline = time.monotonic() + 60
            while not all(pids_with(f"sleep {marker}9{i}") for i in range(3)) and time.monotonic() < deadline:
                time.sleep(0.05)
            samples = [d for d in sandbox_dirs_in(private_tmp) if not d.endswith(sandbox_dirs.NAMES_SUFFIX)]
            assert len(samples) == 3, "the commands never started"  # and, for local, a worker's names directory
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 130, err
    assert wait_gone(marker, 1.0) == []
    assert sandbox_dirs_in(private_tmp) == []
