"""How a bwrap sandbox becomes nobody when the runner is root (sandboxes/user_switch.py): coreutils' chroot
--userspec, or setpriv where chroot is refused; the program before bwrap runs with LC_ALL=C, and the sandbox
gets its own LC_ALL back. In real bwrap sandboxes: the resident shell's commands, a one-off command, a
long-lived process with an environment of its own; and in a runner whose bounding set has no CAP_SYS_CHROOT.
A local sandbox's programs before its shell (setpriv, unshare) run with LC_ALL=C likewise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_support import create, spec_for

from agentbatch.sandboxes import bwrap, sandbox_dirs, shell_program, user_switch
from agentbatch.sandboxes.base import SANDBOX_ENV, SandboxError, SandboxSettings, SandboxSpec

ROOT = Path(__file__).resolve().parents[1]
WHO = "grep -E '^(Uid|Gid|Groups):' /proc/self/status | tr -s '\\t ' ' '; echo \"LC_ALL=$LC_ALL\""


def expected(lc_all: str = SANDBOX_ENV["LC_ALL"]) -> list[str]:
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        return [f"Uid: {uid} {uid} {uid} {uid}", f"Gid: {gid} {gid} {gid} {gid}", f"LC_ALL={lc_all}"]
    return ["Uid: 65534 65534 65534 65534", "Gid: 65534 65534 65534 65534", "Groups:", f"LC_ALL={lc_all}"]


def who(output: str) -> list[str]:
    lines = [line.strip() for line in output.splitlines()]
    return lines if os.geteuid() == 0 else [line for line in lines if not line.startswith("Groups:")]


def test_a_sandbox_runs_as_nobody_with_no_group_and_the_sandboxs_own_locale():
    if os.geteuid() == 0:  # no user database read, and the lighter program where it works (it does here)
        assert user_switch.prefix(65534, 65534)[:2] == [shutil.which("chroot"), "--userspec=+65534:+65534"]
    sandbox = create(spec_for("bwrap"))
    try:
        assert who(sandbox.exec(WHO, timeout=30).output) == expected()
        assert who(sandbox._exec_apart(WHO, timeout=30).output) == expected()  # a command while the shell is busy
        process = sandbox.start(["/bin/sh", "-c", WHO], env={"LC_ALL": "POSIX"})
        assert who(process.stdout.read().decode()) == expected("POSIX")
        process.stdout.close()
    finally:
        sandbox.cleanup()


CHILD = f"""
import json, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from agentbatch import plugins
plugins.load(())
from sandbox_support import create, spec_for
from agentbatch.sandboxes import user_switch
sandbox = create(spec_for("bwrap"))
try:
    print(json.dumps([user_switch.prefix(65534, 65534)[0], sandbox.exec({WHO!r}, timeout=30).output]))
finally:
    sandbox.cleanup()
"""


def test_where_chroot_is_refused_setpriv_makes_the_sandbox_nobody():
    if os.geteuid() != 0:
        pytest.skip("the runner is not root: its sandboxes run as its own uid, with no program before bwrap")
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to run this test as root"
    without_chroot = [setpriv, "--bounding-set=-sys_chroot", "--inh-caps=-sys_chroot", "--"]
    done = subprocess.run([*without_chroot, sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    program, output = json.loads(done.stdout.splitlines()[-1])
    assert program == setpriv
    assert who(output) == expected()


def test_where_nothing_can_drop_root_a_sandbox_says_so_and_leaves_no_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sandbox_dirs, "shared_base", lambda: str(tmp_path))  # where a sandbox nobody enters is made
    monkeypatch.setattr(bwrap, "sandbox_user", lambda: (65534, 65534))
    monkeypatch.setattr(user_switch, "prefix", lambda uid, gid: None)
    with pytest.raises(SandboxError, match="^neither chroot nor setpriv can run commands as nobody"):
        bwrap.BwrapSandbox(SandboxSpec(SandboxSettings(kind="bwrap")))
    assert list(tmp_path.iterdir()) == []


def test_a_local_sandboxs_programs_before_its_shell_read_no_locale_and_its_commands_get_theirs():
    sandbox = create(spec_for("local-pidns"))
    try:
        assert sandbox.exec('echo "LC_ALL=$LC_ALL"', timeout=30).output == f"LC_ALL={SANDBOX_ENV['LC_ALL']}\n"
        holder = sandbox._shell.current.pid  # unshare, exec'd by setpriv: the process before the shell
        with open(f"/proc/{holder}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        assert b"LC_ALL=C" in environ and os.path.basename(os.readlink(f"/proc/{holder}/exe")) == "unshare"
        # What the shell's program gives back is the sandbox's own, quietly: a locale missing here is the commands'.
        start_env, back = shell_program.locale_given_back({"LC_ALL": "xx_YY.UTF-8"})
        done = subprocess.run(
            ["bash", "-c", f'{back}; echo "[$LC_ALL]"'], env=start_env, capture_output=True, text=True
        )
        assert (done.stdout, done.stderr) == ("[xx_YY.UTF-8]\n", "")
        assert shell_program.locale_given_back({})[1] == "unset -v LC_ALL"
    finally:
        sandbox.cleanup()
