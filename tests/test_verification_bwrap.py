"""Setup and checks in bwrap sandboxes (the default where bwrap works), through the real CLI: in the prompt's
own sandbox, killed at their timeout with everything they started, and blind to the runner's key."""

from __future__ import annotations

import uuid

from cli_helpers import RunDir, assert_clean_exit, run_cli, write_dataset
from sandbox_support import new_marker, settings_for, wait_gone
from scripted_server import ScriptedServer
from verify_helpers import answer, args_for, by_prompt, sh


def test_setup_and_checks_run_in_the_prompts_own_bwrap_sandbox(tmp_path):
    settings_for("bwrap")  # skips (a failure in CI) where bwrap cannot run
    secret = f"BRSECRET{uuid.uuid4().hex}"
    naps = new_marker()
    probe = (
        "if (env; cat /proc/*/environ /proc/*/cmdline 2>/dev/null) | grep -aq 'BRSECRE[T]'; then echo FOUND; exit 1; fi"
    )
    rows = [
        {"prompt": "solve", "setup": "echo 6 > n.txt", "verify": 'test "$(cat out.txt)" = 42 && echo "uid $(id -u)"'},
        {"prompt": "hang", "verify": f"echo started; sleep {naps} & sleep {naps}"},
        {"prompt": "key", "verify": f"{probe}; echo scan-done"},
    ]
    script = {"solve": [sh('expr "$(cat n.txt)" \\* 7 > out.txt'), answer("42")]}
    data = write_dataset(tmp_path / "ds.jsonl", rows)
    with ScriptedServer(script=script, default_script=[answer("ok")]) as srv:
        flags = ["--sandbox=bwrap", "--check_timeout=3", f"--api_key={secret}", f"--base_url={srv.base_url}"]
        done = run_cli(args_for(data, tmp_path / "out", "vb", *flags), tmp_path, env={"OPENROUTER_API_KEY": secret})
    assert_clean_exit(done)
    lines = by_prompt(RunDir(tmp_path / "out" / "vb").trajectories())
    [solved] = lines["solve"]  # the agent's file, made from the setup's file, checked in the same sandbox
    assert (solved["passed"], solved["reward"], solved["check"]["status"]) == (True, 1.0, "passed")
    assert solved["check"]["output"] != "uid 0\n", "the check ran as root: bwrap runs it unprivileged"
    [hung] = lines["hang"]
    assert (hung["check"]["status"], hung["check"]["output"], hung["passed"]) == ("timeout", "started\n", None)
    assert wait_gone(naps, 5.0) == [], "the hanging check's processes outlived it"
    [key] = lines["key"]
    assert (key["passed"], key["check"]["output"]) == (True, "scan-done\n")
    hits = [p.name for p in (tmp_path / "out").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not hits and secret not in done.stdout + done.stderr
