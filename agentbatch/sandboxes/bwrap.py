"""The bwrap backend: a bubblewrap sandbox per sample over its temporary directory, a fork of its shell per command.

What a command sees: the host's system directories read-only (/usr, /etc, the /bin and /lib links...),
its own /proc (only its own processes), a private /dev, its working directory (the row's `cwd` as a path
inside the sandbox, else /workspace) and /tmp, both backed by the sample's temporary directory so files
stay from one command to the next, nothing else of the host. It runs in new user, PID, IPC and UTS
namespaces (and network, with `network=False`), without capabilities, as `nobody` when the runner is root
(else as the runner's own uid), with no_new_privs, under rlimits (processes, data size, file size, CPU
time) and an OOM score that makes the kernel kill it before the runner.

The sandbox is made at the sample's first command, or beside its first model call (early.py): bwrap (with
--die-with-parent) starts the sample's resident shell as PID 1 of its PID namespace (resident.py), and every
command is a fork of that shell.
Containment by construction: when a command's shell exits, PID 1 kills every other process of the
namespace and waits for them to be gone before it reports the exit code; when the deadline passes, or
when the worker dies, bwrap dies, PID 1 with it, and the kernel kills everything left in the namespace:
setsid, double forks and processes that changed their environment included. Nothing is looked for;
nothing survives its command. A command that comes while another runs (a tool's threads) gets a sandbox
of its own, as every command had before: the same view, made for it alone.

The file tools act in the same view: a path that maps, without symbolic links or `..`, onto the prompt's
directories (or, for reads, onto a system directory the sandbox's user may read) is read or written
directly, below that directory (confined.py); any other path is read or written by a small script run
inside a sandbox like the terminal's, so it reaches exactly what the terminal would.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import pwd
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from functools import cache

from agentbatch.sandboxes import confined, registry, sandbox_dirs, user_switch
from agentbatch.sandboxes.base import (
    MAX_FILE_BYTES,
    SANDBOX_ENV,
    ExecResult,
    SandboxError,
    SandboxSettings,
    SandboxSpec,
    one_line,
)
from agentbatch.sandboxes.output import stream
from agentbatch.sandboxes.process import PipeProcess, on_lasting_thread
from agentbatch.sandboxes.resident import ResidentShell, SampleShell, ShellStart, WarmsItsShell
from agentbatch.sandboxes.shell_program import NAMED, TEXT_LINK

DEFAULT_WORKDIR = "/workspace"
FILE_OP_TIMEOUT = 60.0  # also how long a long-lived process's sandbox may take to start
SHM_BYTES = 64 * 1024 * 1024
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# What the sandbox has of its own; a cwd may not lie inside them.
PRIVATE_DIRS = ("/proc", "/dev", "/sys", "/run")
STARTED = b"br-sandbox-started\n"
# The shell that starts every command: says the sandbox is up, volunteers to the OOM killer, runs it.
START = 'printf "br-sandbox-started\\n"; echo 1000 > /proc/self/oom_score_adj 2>/dev/null; exec /bin/bash -c "$1"'
# Where the resident shell's commands read their text through (shell_program.NAMED): in the sandbox's own /dev.
# A read-only mount of its own, so that no command can remove the link (or the directory) its sample's later
# commands are read through; then the shell as PID 1 (no bwrap init).
NAMES = "/dev/.br"
_SHELL_OPTIONS = ["--tmpfs", NAMES, "--symlink", TEXT_LINK, f"{NAMES}/{NAMED}", "--remount-ro", NAMES, "--as-pid-1"]
SHELL_OPTIONS = b"\0".join(option.encode() for option in _SHELL_OPTIONS) + b"\0"
# The same for a long-lived process: its argv follows.
START_PROCESS = 'printf "br-sandbox-started\\n"; echo 1000 > /proc/self/oom_score_adj 2>/dev/null; exec "$@"'
# The file tools' operations inside the sandbox, for paths the direct route cannot take.
FILE_OP = r"""printf "br-sandbox-started\n"
p=$2
if [ -d "$p" ]; then echo "$p is a directory" >&2; exit 4; fi
case $1 in
read)
  if [ ! -e "$p" ]; then echo "no such file: $p" >&2; exit 3; fi
  if [ ! -f "$p" ]; then echo "$p is not a regular file (a FIFO, device or socket); the file tools read only files" >&2; exit 5; fi
  if [ ! -r "$p" ]; then echo "$p: permission denied" >&2; exit 6; fi
  exec head -c "$3" -- "$p";;
write)
  if [ -e "$p" ] && [ ! -f "$p" ]; then echo "$p is not a regular file; the file tools write only files" >&2; exit 5; fi
  if [ -f "$p" ]; then
    n=$(stat -L -c %h -- "$p")
    if [ "$n" -gt 1 ]; then
      echo "$p has $n hard links: writing it would change the other files too; remove it first or write another path" >&2
      exit 8
    fi
  fi
  mkdir -p -- "$(dirname -- "$p")" || exit 1
  exec cat > "$p";;
esac
"""
_ERRORS = {3: FileNotFoundError, 4: IsADirectoryError, 5: OSError, 6: PermissionError, 8: PermissionError}


def limits(s: SandboxSettings, bash: bool = False) -> str:
    """The sandbox's limits as the first words of its shell's program, dash's (`bash`: bash's) `ulimit`s: -d in KiB,
    the processes -p (bash: -u), the file size -f in 512-byte blocks (bash: 1024), rounded down to whole KiB in
    both. The limits apply inside the new user namespace, so the process count is this sandbox's alone. Set by the
    shell bwrap starts rather than by a prlimit between them, one exec less at every sandbox's start (bench (23));
    a limit the shell cannot set (above the runner's own hard limit) ends the start, naming its flag."""
    steps = [
        ("u" if bash else "p", s.processes, s.processes, "sandbox_processes"),
        ("d", s.memory_bytes // 1024, s.memory_bytes, "sandbox_memory"),
        ("f", s.file_size_bytes // 1024 * (1 if bash else 2), s.file_size_bytes, "sandbox_file_size"),
        ("t", s.cpu_seconds, s.cpu_seconds, "sandbox_cpu_seconds"),
    ]
    why = "cannot set the sandbox's limit --{}={}: it is above this runner's own hard limit"
    return "".join(
        f'ulimit -{o} {v} 2>/dev/null || {{ echo "{why.format(f, n)}" >&2; exit 126; }}; ' for o, v, n, f in steps
    )


def _raise_oom(pid: int) -> None:
    """Offer a process first to the kernel's OOM killer (what it starts inherits it); never raises."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as f:
        f.write("1000")


@cache
def _bwrap_path() -> str | None:
    return shutil.which("bwrap")


@cache
def _layout() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The bwrap arguments for the host's system directories, and their (path in sandbox, host path) mounts."""
    args: list[str] = []
    mounts: list[tuple[str, str]] = []
    for d in SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
            mounts.append((d, d))
    # A resolv.conf linked into /run (systemd-resolved) would dangle: bind the directory it lives in.
    real = os.path.realpath("/etc/resolv.conf")
    if os.path.exists(real) and not any(real.startswith(d + "/") for d, _ in mounts):
        where = os.path.dirname(real)
        args += ["--ro-bind", where, where]
        mounts.append((where, where))
    return tuple(args), tuple(mounts)


def sandbox_user() -> tuple[int, int] | None:
    """The uid and gid commands run as when the runner is root (nobody); None: the runner's own."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam("nobody")
        return pw.pw_uid, pw.pw_gid
    except KeyError:
        return 65534, 65534


class BwrapSandbox:
    """One sample's bwrap sandbox: a directory on the host, and the namespaces over it with their resident shell."""

    def __init__(self, spec: SandboxSpec, lasting: bool = True):
        """`lasting=False`: its shell is started from the caller's thread (a probe's, which ends it before returning)."""
        self.settings = spec.settings
        self._lasting = lasting
        self.workdir = posixpath.normpath(spec.cwd) if spec.cwd else DEFAULT_WORKDIR
        self._user = sandbox_user()
        switch = user_switch.prefix(*self._user) if self._user else []  # before any directory is made for it
        if switch is None:
            raise SandboxError(
                "neither chroot nor setpriv can run commands as nobody (Debian: apt-get install coreutils util-linux)"
            )
        # The base stays the runner's (others may only pass through it); work/ and tmp/ are the sandbox user's.
        self._base = sandbox_dirs.make(0o711, reachable=self._user is not None)
        self._work = os.path.join(self._base, "work")
        self._tmp = os.path.join(self._base, "tmp")
        for d in (self._work, self._tmp):
            os.mkdir(d, 0o755)
            if self._user:
                os.chown(d, *self._user)
        self._env = dict(SANDBOX_ENV, HOME="/tmp", TMPDIR="/tmp", PWD=self.workdir)
        self._start_env, self._env_back = self._environment(self._env)
        self._processes: list[PipeProcess] = []
        system_args, system_mounts = _layout()
        writable = [(self.workdir, self._work)]
        if self.workdir != "/tmp":
            writable.append(("/tmp", self._tmp))
        # (path in the sandbox, host directory or None for what only the sandbox can show, writable)
        mounts = [(p, h, True) for p, h in writable] + [(p, h, False) for p, h in system_mounts]
        mounts += [(p, None, False) for p in PRIVATE_DIRS]
        mounts += [(d, None, False) for d in SYSTEM_DIRS if os.path.islink(d)]
        self._mounts = sorted(mounts, key=lambda m: len(m[0]), reverse=True)
        self._outer, opts, self._limits = self._bwrap_args(switch, system_args)
        self._shell_limits = limits(self.settings, bash=True)
        self._options = b"".join(o.encode() + b"\0" for o in opts)
        self._shell = SampleShell(self, BwrapSandbox._resident_shell)

    def _resident_shell(self) -> ResidentShell:
        return ResidentShell(self._shell_prefix, self._start_env, "/", NAMES, self._lasting)

    def _environment(self, env: dict[str, str]) -> tuple[dict[str, str], bytes]:
        """What bwrap (and the program before it) starts with, and bwrap's options that give the sandbox `env`."""
        return user_switch.environment(env) if self._user else (env, b"")

    def _bwrap_args(self, switch: list[str], system_args: tuple[str, ...]) -> tuple[list[str], list[str], str]:
        """The command line before bwrap's options (`switch`: what drops root before it), the options (given on a
        pipe), and the limits' shell prefix."""
        s = self.settings
        outer = [*switch, _bwrap_path()]
        opts = ["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        opts += ["--hostname", "sandbox", "--die-with-parent", "--new-session"]
        if not s.network:
            opts.append("--unshare-net")
        if self.workdir == "/":
            opts += ["--bind", self._work, "/"]
        opts += [*system_args, "--proc", "/proc", "--dev", "/dev"]
        opts += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
        if self.workdir == "/tmp":
            opts += ["--bind", self._work, "/tmp"]
        else:
            opts += ["--bind", self._tmp, "/tmp"]
            if self.workdir != "/":
                opts += ["--bind", self._work, self.workdir]
        if self.workdir != "/":
            opts += ["--remount-ro", "/"]
        opts += ["--chdir", self.workdir]
        return outer, opts, limits(s)

    def _argv(self, script: str, *args: str, env_back: bytes | None = None) -> tuple[list[str], int]:
        """The command line of `sh -c script sh args` in a sandbox of its own, and the pipe with bwrap's options
        (close it after); `env_back`: the options that give it its environment (_environment), if not the sandbox's."""
        # Options on a pipe keep the host's paths out of PID 1's command line, which `ps` shows the model.
        read, write = os.pipe()
        os.write(write, self._options + (self._env_back if env_back is None else env_back))
        os.close(write)
        return [*self._outer, "--args", str(read), "--", "/bin/sh", "-c", self._limits + script, "sh", *args], read

    def _shell_prefix(self) -> ShellStart:
        """What starts the resident shell: this sandbox, the shell as its PID 1 (no bwrap init, no sh before it),
        its limits set by the shell itself, its oom_score_adj by this process before bwrap has read its options,
        so before the shell exists (it inherits it; non-dumpable, it could not raise its own)."""
        read, write = os.pipe()
        # Not the sandbox: the lasting thread may hold `started` a while.
        options = self._options + self._env_back + SHELL_OPTIONS

        def started(pid: int | None) -> None:
            try:
                if pid is not None:
                    _raise_oom(pid)
                    with contextlib.suppress(OSError):
                        os.write(write, options)
            finally:
                os.close(write)

        return ShellStart([*self._outer, "--args", str(read), "--"], (read,), self._shell_limits, started)

    def warm(self) -> bool:
        """Start the resident shell now, without waiting for it (early.py); whether one started."""
        return self._shell.launch()

    @property
    def ran_commands(self) -> bool:
        """Whether a command asked for the resident shell."""
        return self._shell.used

    def exec(self, command: str, timeout: float) -> ExecResult:
        done = self._shell.run(command, timeout)
        return done if done is not None else self._exec_apart(command, timeout)

    def _exec_apart(self, command: str, timeout: float) -> ExecResult:
        """A command in a bwrap sandbox of its own over the same directories (the resident shell is busy)."""
        argv, options = self._argv(START, command)
        try:
            done = stream(
                argv, env=self._start_env, cwd="/", timeout=timeout, kill=lambda proc: proc.kill(), pass_fds=(options,)
            )
        finally:
            os.close(options)
        started = done.output.take_prefix(STARTED)
        if done.timed_out:
            return ExecResult(done.output.text(), -9, timed_out=True)
        if not started:
            raise SandboxError(f"the bwrap sandbox did not start: {one_line(done.output.text())}")
        return ExecResult(done.output.text(), done.returncode)

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> PipeProcess:
        """A process in a bwrap sandbox of its own over the sample's directories: it sees the same files."""
        if not argv:
            raise SandboxError("no command to start")
        start_env, env_back = self._environment({**self._env, **(env or {})})
        command, options = self._argv(START_PROCESS, *argv, env_back=env_back)

        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                command,
                cwd="/",
                env=start_env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(options,),
            )

        try:
            proc = on_lasting_thread(popen)
        except OSError as e:
            raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
        finally:
            os.close(options)
        process = PipeProcess(proc, _kill_group)
        if not _read_exactly(proc.stdout.fileno(), STARTED, FILE_OP_TIMEOUT):
            process.kill()
            raise SandboxError(f"the bwrap sandbox did not start: {one_line(process.stderr())}")
        self._processes.append(process)
        return process

    def read_file(self, path: str, limit: int | None = None) -> bytes:
        cap = MAX_FILE_BYTES + 1 if limit is None else limit
        direct = self._direct(path)
        data = None
        if direct is not None:
            root, parts, writable = direct
            try:
                # Reading a system file for `nobody` while running as root: only what anyone may read.
                data = confined.read(root, parts, cap, others_only=not writable and self._user is not None)
            except PermissionError:
                data = None  # a symlink, or permissions the sandbox itself must judge
        if data is None:
            data = self._file_op("read", path, str(cap))
        if limit is None and len(data) > MAX_FILE_BYTES:
            raise OSError(f"{path} is over the {MAX_FILE_BYTES} byte limit")
        return data

    def write_file(self, path: str, data: bytes) -> None:
        direct = self._direct(path)
        if direct is not None and direct[2]:
            try:
                confined.write(direct[0], direct[1], data, owner=self._user)
                return
            except confined.SymlinkRefused:
                pass  # the sandbox follows it, within its own view
        self._file_op("write", path, "", data)

    def confine(self, path: str) -> str:
        """Any path: commands and searches run inside the sandbox, which is the confinement."""
        return path

    def _direct(self, path: str) -> tuple[str, list[str], bool] | None:
        """(host directory, components below it, writable) when the path maps onto one without `..`."""
        if ".." in path.split("/"):
            return None  # `..` after a symlink means what the kernel says, not the text: ask the sandbox
        full = posixpath.normpath(posixpath.join(self.workdir, path))
        for inside, host, writable in self._mounts:
            parts = confined.parts_beneath(inside, full)
            if parts is not None:
                return (host, parts, writable) if host else None
        return None

    def _file_op(self, op: str, path: str, limit: str, data: bytes = b"") -> bytes:
        argv, options = self._argv(FILE_OP, op, path, limit)
        try:
            done = subprocess.run(
                argv,
                input=data,
                capture_output=True,
                env=self._start_env,
                cwd="/",
                timeout=FILE_OP_TIMEOUT,
                pass_fds=(options,),
            )
        except subprocess.TimeoutExpired:
            raise OSError(f"{path}: the file operation did not finish in {FILE_OP_TIMEOUT:g} s") from None
        finally:
            os.close(options)
        # "sh: 19: cannot create /etc/x: Read-only file system": the script's line number means nothing to the model.
        message = re.sub(r"^sh: \d+: ", "", one_line(done.stderr.decode("utf-8", "replace")))
        if not done.stdout.startswith(STARTED):
            raise SandboxError(f"the bwrap sandbox did not start: {message}")
        if done.returncode != 0:
            raise _ERRORS.get(done.returncode, OSError)(message or f"{op} {path} failed (exit {done.returncode})")
        return done.stdout[len(STARTED) :]

    def cleanup(self) -> None:
        self._shell.close()
        processes, self._processes = self._processes, []
        for process in processes:
            process.kill()
        sandbox_dirs.remove(self._base)


def _kill_group(proc: subprocess.Popen) -> None:
    """bwrap and its sandbox's PID 1 with it: the kernel then ends everything in the sandbox."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _read_exactly(fd: int, expected: bytes, timeout: float) -> bool:
    """Read len(expected) bytes from fd within timeout; whether they were `expected` (False at EOF or time)."""
    got, deadline = b"", time.monotonic() + timeout
    while len(got) < len(expected):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return False
        data = os.read(fd, len(expected) - len(got))
        if not data:
            return False
        got += data
    return got == expected


_probe_lock = threading.Lock()
_probed: dict[bool, str | None] = {}


def probe(settings: SandboxSettings | None = None) -> str | None:
    """None if bwrap sandboxes work on this machine (tried once per process), else why not."""
    settings = settings or SandboxSettings(kind="bwrap")
    with _probe_lock:
        if settings.network not in _probed:
            _probed[settings.network] = _try(settings)
        return _probed[settings.network]


def _try(settings: SandboxSettings) -> str | None:
    if _bwrap_path() is None:
        return "bwrap not found (Debian: apt-get install bubblewrap)"
    sandbox = None
    try:
        sandbox = BwrapSandbox(SandboxSpec(settings), lasting=False)  # the runner forks its workers as one thread
        result = sandbox.exec("exit 0", timeout=30)
        return None if result.exit_code == 0 else f"a test command failed: {one_line(result.output)}"
    except (SandboxError, OSError) as e:
        return str(e)
    finally:
        if sandbox is not None:
            sandbox.cleanup()


def check_cwd(cwd: str | None) -> None:
    """Raise SandboxError if the row's cwd cannot be a working directory in the bwrap sandbox."""
    if not cwd:
        return
    path = posixpath.normpath(cwd)
    if not posixpath.isabs(path):
        raise SandboxError(f"cwd {cwd!r} must be an absolute path inside the sandbox")
    for d in PRIVATE_DIRS:
        if path == d or path.startswith(d + "/"):
            raise SandboxError(f"cwd {cwd!r} lies in {d}, which the bwrap sandbox makes its own")
    for d in SYSTEM_DIRS:
        if (path == d or path.startswith(d + "/")) and (os.path.islink(d) or not os.path.isdir(path)):
            raise SandboxError(f"cwd {cwd!r} lies in {d}, read-only in the bwrap sandbox, and is no directory there")


@registry.backend("bwrap")
class BwrapBackend(WarmsItsShell, sandbox_dirs.WorkerDirBackend):
    """A bubblewrap sandbox per sample over its directory, each command a fork of its resident shell."""

    def prepare_run(self, settings: SandboxSettings) -> str:
        why_not = probe(settings)
        if why_not:
            raise SandboxError(f"bwrap does not work here: {why_not}")
        user = "nobody" if sandbox_user() else "your uid"
        net = "network on" if settings.network else "no network"
        return f"sandbox: bwrap (each sample in its own namespaces as {user}, system directories read-only, {net})"

    def prepare(self, spec: SandboxSpec) -> None:
        check_cwd(spec.cwd)
        reason = probe(spec.settings)  # once per process: a spawned worker has not seen the parent's
        if reason:
            raise SandboxError(f"the bwrap sandbox does not work here: {reason}")

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        return BwrapSandbox(spec)
