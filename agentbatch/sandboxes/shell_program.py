"""What a resident shell (resident.py) runs and reads: its program, a command's text, where that text is named.

- `runner_script`: the shell's program, a loop that forks a subshell for each command and sources its text;
- `request`: what the command memfd holds for one command;
- `hold_host_names`: the directory of this machine where `bash` leads to a command's text (local sandboxes;
  bwrap makes its own in the sandbox's /dev);
- `shell_fd`: the copy of bash the shell is executed from, which its user may run but not read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import threading

from agentbatch.sandboxes import sandbox_dirs

BASH = "/bin/bash"  # what every command ran in before, the host's own in bwrap and local alike
READY = "ready"
LOCALE = "LC_ALL"
TEXT_FD = 3  # the command's text, in the command's shell until its first command (the `bash` in `names` leads to it)
ENTER = "__br_enter"
TEXT_PREFIX = f"{ENTER}; "
NAMED = "bash"  # the link to the text (TEXT_LINK) in a shell's `names` directory
TEXT_LINK = f"/proc/self/fd/{TEXT_FD}"  # where NAMED leads, in each command's shell its own fd 3
_MFD_EXEC = 0x0010  # memfd_create's MFD_EXEC (Linux 6.3+): executable even where memfds default to noexec


def runner_script(out: int, command: int, shell: int | None, names: str, prelude: str = "") -> str:
    """The shell's program, on one line so that a command's line numbers are its own (its text is read from line 1).

    `out`, `command`, `shell`: the numbers of its output pipe, its command memfd and the copy of bash it was
    executed from (None: plain bash), as it inherits them; `names`: the directory, in the sandbox's view, that
    holds `bash`, a symbolic link to the command's text; `prelude`, bash's words run first (the sandbox's limits,
    its LC_ALL given back).
    """
    take = "" if command == TEXT_FD else f" {TEXT_FD}<&{command} {command}<&-"
    run = [
        "set +m",  # the command's own shell has no job control, as `bash -c` has none
        f"exec 0</dev/null 1>&{out} 2>&{out} {out}>&-{take}",
        # Sourced, not eval'd: bash execs the text's last command in this very process, where `eval` forks once
        # more for it (a seventh of what `pwd; ls /` costs the machine, bench (23)). Sourced as `bash`, from
        # `names`, so that bash's messages name it `bash` (BASH_SOURCE), not a path of ours.
        f". {NAMED}",
    ]
    names = shlex.quote(names)
    steps = [
        *([prelude.rstrip("; ")] if prelude else []),  # its stderr is the status pipe until the next step
        f"exec {'' if shell is None else f'{shell}<&- '}2>/dev/null",  # job notices go nowhere
        "set -m",  # job control: each command in the foreground, in a process group of its own
        "__br_wd=$PWD",
        # Called by the text's first line (request) once bash has read the text: what precedes its first command.
        f'{ENTER}() {{ exec {TEXT_FD}<&-; shopt -s sourcepath; cd -- "$__br_wd" || exit 126;'
        # OLDPWD exported and unset, as a fresh bash has it; nothing of the shell's own left.
        f" unset -v OLDPWD __br_wd __br_go __br_rc __br_text; export OLDPWD; unset -f {ENTER}; }}",
        # `bash` is the file in `names` (the shell's own directory from now on), not the one on PATH.
        f'{{ cd -- {names} && shopt -u sourcepath; }} || {{ printf "cannot enter %s\\n" {names}; exit 1; }}',
        f'printf "{READY}\\n"',
        "while read -r __br_go; do unset -v BASH_EXECUTION_STRING __br_text",
        # The whole text (it holds no NUL), read buffered from the offset the runner put back at 0 (request).
        f"mapfile -d '' -n 1 -u {command} __br_text",
        f'[[ ${{__br_text[0]}} == "{TEXT_PREFIX}"* ]] || {{ printf "unread\\n"; continue; }}',
        f'BASH_EXECUTION_STRING=${{__br_text[0]#"{TEXT_PREFIX}"}}',  # as `bash -c` has it
        "( " + "; ".join(run) + " ); __br_rc=$?",
        # Only as PID 1 of its own namespace does kill -1 mean "every process of this sandbox".
        # Each kill -1 walks every task of the machine: the first only asks whether one of this namespace is left.
        'if [ "$$" = 1 ] && kill -0 -1; then kill -9 -1; while kill -0 -1; do read -r -t 0.002 __br_go; done;'
        " fi 2>/dev/null",
        'printf "%d\\n" "$__br_rc"; done',
    ]
    return "; ".join(steps)


def locale_given_back(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """The environment to start a shell's chain with, LC_ALL=C (the programs before the shell read no locale files:
    ~0.2-0.35 ms each, bench/RESULTS.md), and the words of the shell's program that give it `env`'s own LC_ALL back
    (quietly: a missing locale is the commands' to hear of, as before)."""
    value = env.get(LOCALE)
    back = f"unset -v {LOCALE}" if value is None else f"export {LOCALE}={shlex.quote(value)} 2>/dev/null"
    return {**env, LOCALE: "C"}, back


def request(command: str) -> bytes:
    """What the memfd holds for one command: the text after TEXT_PREFIX, on the text's own first line (so that its
    line numbers are the text's), which readies the command's shell once bash has read the text (ENTER). The
    runner writes it at offset 0 and puts the memfd's offset, which the shell shares, back at 0."""
    if "\0" in command:
        raise ValueError("embedded null byte")
    return (TEXT_PREFIX + command).encode("utf-8", "surrogateescape")


_shell_lock = threading.Lock()
_shell: list[int | None] = []  # [fd of the exec-only copy of bash, or None where the kernel refused it]


def shell_fd() -> int | None:
    """A memfd holding bash that the sandbox's user may execute but not read (so it runs non-dumpable), made once
    per process and shared by its forks; None where this kernel cannot have one."""
    with _shell_lock:
        if not _shell:
            _shell.append(_exec_only_copy(BASH))
        return _shell[0]


def _exec_only_copy(path: str) -> int | None:
    for flags in (os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING | _MFD_EXEC, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING):
        try:
            fd = os.memfd_create("bash", flags)
        except (OSError, AttributeError):
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o111)
            seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            return fd
        except (OSError, AttributeError):
            os.close(fd)
    return None


def forget_shell() -> None:
    """Use plain bash from now on (the kernel refused to execute the copy)."""
    with _shell_lock:
        if _shell and _shell[0] is not None:
            with contextlib.suppress(OSError):
                os.close(_shell[0])
        _shell[:] = [None]


_names_lock = threading.Lock()
_names: dict = {}  # this process's names directory: {"pid", "path", "holders"} (a forked child makes its own)


def hold_host_names() -> str:
    """A directory of this machine holding NAMED, for the resident shells that see its files (local): this process's
    `br-sandbox-<owner>-names` (sandbox_dirs), made when its first local sandbox needs it and removed when the last
    lets go (`release_host_names`); a dead process's is reaped with its sandboxes."""
    with _names_lock:
        if _names.get("pid") != os.getpid():
            _names.clear()
            _names.update(pid=os.getpid(), path=None, holders=0)
        if _names["path"] is None or not os.path.islink(os.path.join(_names["path"], NAMED)):
            _names["path"] = _make_names()
        _names["holders"] += 1
        return _names["path"]


def release_host_names() -> None:
    """One local sandbox lets go of the names directory; the last one removes it."""
    with _names_lock:
        if _names.get("pid") != os.getpid() or _names["holders"] == 0:
            return
        _names["holders"] -= 1
        if _names["holders"] == 0 and _names["path"] is not None:
            sandbox_dirs.remove(_names["path"])
            _names["path"] = None


def _make_names() -> str:
    path = sandbox_dirs.names_dir()
    link = os.path.join(path, NAMED)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    os.symlink(TEXT_LINK, link)
    return path
