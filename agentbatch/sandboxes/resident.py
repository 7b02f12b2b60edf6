"""A sample's resident shell: one bash per sandbox, PID 1 of its PID namespace, that runs each command in a fork.

Making a sandbox (namespaces, mounts, setpriv, prlimit, a shell) cost 11-12 ms of the machine's CPU for every
command; a fork of a shell that is already there costs a fraction of one (bench/RESULTS.md, (23)). So the
bwrap and local sandboxes start this shell once, at their first command or beside the sample's first model call
(early.py), and hand it each command:

- the command's text goes into a memfd only the shell holds, a newline on its stdin says "run it";
- the shell forks a subshell in the foreground, in a process group of its own (job control), with no signal
  ignored; it takes /dev/null as stdin and the output pipe as stdout and stderr, closes every descriptor of
  the shell's own but the text's (fd 3), and sources the text as `bash` from a directory where that name
  leads to fd 3 (`names`), so that bash names it `bash` in its messages; the text's first line begins with a
  call (ENTER) that closes fd 3 and goes to the working directory before the text's first command runs.
  Sourced rather than `eval`'d, the text's last command is exec'd in the subshell itself, as `bash -c` does,
  where `eval` forked once more. The limits (bwrap's, set by the shell's program first) are the shell's, so
  each process's own as before, and so is its oom_score_adj (raised by the runner before bwrap makes the
  shell). What differs from a `bash -c` of its own: `$$` is the shell's PID (1), messages name `bash` where
  they named `/bin/bash` ($0), a syntax error on the first line shows that line after ENTER's call, `return`
  outside a function ends the text (as in a sourced file), BASH_SOURCE is (bash), and a command that stops
  itself ends (exit 147) instead of waiting for its deadline;
- once the subshell has exited, the shell, PID 1, kills every other process of the namespace (`kill -9 -1`),
  waits until none is left, and only then writes the exit code on the status pipe: all the command's output
  is in the output pipe by then, and nothing it started runs on.

What a command cannot do to the shell: signal it (the kernel delivers no signal to a namespace's PID 1 from
inside it that PID 1 does not handle), or read, trace or write it: the shell is executed from a copy of bash
its user may run but not read, so the kernel makes it non-dumpable (its /proc/1/mem, fd, environ and ptrace
are refused to the commands), and the memfd is read-only to that user. Where the kernel cannot execute that
copy, plain bash runs (dumpable: a command could then tamper with its own sample's shell, not escape).

Everything that goes wrong ends in one way: the shell is killed (its namespace, and all in it, with it) and
the next command starts another. A command past its deadline kills it; a shell that dies under a command
fails that command (SandboxError); a shell busy with one command (two at once from a tool's threads) leaves
the other to the backend's one-off sandbox.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from agentbatch.sandboxes.base import ExecResult, SandboxError, one_line
from agentbatch.sandboxes.output import KILL_GRACE, BoundedOutput, Streamed
from agentbatch.sandboxes.process import on_lasting_thread_soon
from agentbatch.sandboxes.shell_program import BASH, READY, forget_shell, request, runner_script, shell_fd

START_TIMEOUT = 60.0  # seconds a shell may take to start (bwrap under a loaded machine)
_CHUNK = 65536


@dataclass
class ShellStart:
    """How a resident shell starts, as its sandbox's `prefix()` says: `argv`, the command line that puts a program in
    the sandbox as PID 1 of its PID namespace; `pass_fds`, the fds that needs (closed here once it started);
    `prelude`, bash's words run first in the shell's program (shell_program.runner_script): bwrap's limits, local's
    LC_ALL given back; `started(pid)`, called once the process exists (None: it could not start), before it goes
    on; `env`, the environment `argv` starts with where it is not the shell's own (`prelude` gives it back)."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()
    prelude: str = ""
    started: Callable[[int | None], None] | None = None
    env: dict[str, str] | None = None


class ShellEnded(SandboxError):
    """The resident shell ended (or broke its protocol) while a command ran: that command fails."""


class ResidentShell:
    """A running resident shell: `run` one command at a time (holding `lock`); `close` ends it and its namespace.

    `prefix()` gives how it starts (ShellStart: bwrap's, or setpriv and unshare); it runs with `env` in `cwd`;
    `names`, a directory its user may read, holds shell_program.NAMED, the name a command's text is read by.
    It is started from the process's lasting thread (process.py), since it dies with the thread that
    started it; `lasting=False` starts it from the caller's (a probe, whose shell ends before it returns).
    """

    def __init__(
        self,
        prefix: Callable[[], ShellStart],
        env: dict,
        cwd: str,
        names: str,
        lasting: bool = True,
    ):
        self.lock = threading.Lock()
        self._lasting = lasting
        self._how = (prefix, env, cwd)
        self._names = names
        self.dead = False
        self._ready = False
        self._proc: subprocess.Popen | None = None
        self._popen: Future | None = None  # the process's start, handed to the lasting thread, until `_started`
        self._popen_lock = threading.Lock()
        self._buffer = b""
        self._req = self._status = self._out = self._command = -1
        self._command = os.memfd_create("command", os.MFD_CLOEXEC)
        os.fchmod(self._command, 0o444)  # its user may read it, not write it (this process writes through its fd)
        self._shell = shell_fd()
        # Started now, waited for at the first command (`ready`): a shell started beside the sample's first model
        # call comes up while the model thinks (early.py).
        self._why: str | None = self._launch(self._shell)

    def ready(self) -> None:
        """Wait until the shell has said it is ready (at once after the first time); SandboxError if it cannot start."""
        if self._ready:
            return
        why = self._why or self._await_ready()
        if why is not None and self._shell is not None and "fd/" in why:
            forget_shell()  # this kernel would not execute the copy (a noexec memfd): plain bash from now on
            self._shell = None
            why = self._launch(None) or self._await_ready()
        if why is not None:
            self.close()
            raise SandboxError(f"the sandbox did not start: {why}")
        self._ready = True

    def _launch(self, shell: int | None) -> str | None:
        """Start the shell without waiting for it, nor for its process (`_started`): None, or why it cannot start."""
        self._close_pipes()
        prefix, env, cwd = self._how
        req_r, self._req = os.pipe()
        self._status, status_w = os.pipe()
        self._out, out_w = os.pipe()
        os.set_blocking(self._out, False)
        try:
            start = prefix()
        except (SandboxError, OSError) as e:
            for fd in (req_r, status_w, out_w):
                os.close(fd)
            return str(e)
        path = f"/proc/self/fd/{shell}" if shell is not None else BASH
        script = runner_script(out_w, self._command, shell, self._names, start.prelude)
        argv = [*start.argv, path, "-c", script, "/bin/bash"]  # $0 as before
        fds = (*start.pass_fds, out_w, self._command, *(() if shell is None else (shell,)))

        def popen() -> subprocess.Popen:
            proc = None
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=req_r,
                    stdout=status_w,
                    stderr=status_w,
                    env=env if start.env is None else start.env,
                    cwd=cwd,
                    start_new_session=True,
                    pass_fds=fds,
                )
                return proc
            finally:
                for fd in (req_r, status_w, out_w, *start.pass_fds):
                    os.close(fd)
                if start.started is not None:
                    start.started(proc.pid if proc is not None else None)

        if self._lasting:
            self._popen = on_lasting_thread_soon(popen)  # the caller goes on (to its model call) meanwhile
        else:
            self._popen = Future()
            try:
                self._popen.set_result(popen())
            except OSError as e:
                self._popen.set_exception(e)
        return None

    def _started(self) -> str | None:
        """Wait for the shell's process to have been started: None once it was, else why not."""
        with self._popen_lock:  # a kill from another thread sees the process once it is there
            if self._popen is not None:
                popen, self._popen = self._popen, None
                try:
                    self._proc = popen.result()
                except OSError as e:
                    return f"cannot start its shell: {e}"
        return None

    def _await_ready(self) -> str | None:
        """Wait for the launched shell to say it is ready; None once it did, else why not (and it is ended)."""
        why = self._started()
        if why is not None:
            self._end()
            return why
        started = self._line(time.monotonic() + START_TIMEOUT)
        if started == READY:
            return None
        said = one_line(f"{started or ''} {self._buffer.decode('utf-8', 'replace')}")
        self._end()
        return said or "its shell ended at once"

    @property
    def pid(self) -> int | None:
        """The host PID of the process that holds the shell (bwrap, or unshare), None once it ended."""
        self._started()
        return self._proc.pid if self._proc is not None else None

    def run(self, command: str, timeout: float) -> Streamed:
        """Run one command (the caller holds `lock`); past `timeout` the shell is killed, and the command with it."""
        text = request(command)
        self.ready()
        if self.dead:
            raise ShellEnded("the sandbox's shell has ended")
        os.ftruncate(self._command, 0)
        os.pwrite(self._command, text, 0)
        os.lseek(self._command, 0, os.SEEK_SET)  # where the shell reads it from (the offset is shared)
        out = BoundedOutput()
        deadline = time.monotonic() + max(float(timeout), 0.1)
        try:
            os.write(self._req, b"\n")
        except OSError:
            self.kill()
            raise ShellEnded("the sandbox's shell ended before the command could start") from None
        status = self._pump(out, deadline)
        if status is None:  # the deadline
            self.kill()
            self._drain(out, time.monotonic() + KILL_GRACE)
            return Streamed(out, None, True)
        self._drain(out, None)
        if not status.lstrip("-").isdigit():
            self.kill()
            said = f" ({one_line(status, 120)})" if status else ""
            raise ShellEnded(f"the sandbox's shell ended while the command ran{said}; the next command gets a new one")
        return Streamed(out, int(status), False)

    def _pump(self, out: BoundedOutput, deadline: float) -> str | None:
        """Output into `out` until the status line comes (its text; "" if the shell ended), or None at the deadline."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self._out, self._status], [], [], remaining)
            if self._out in ready:
                self._read_output(out)
            if self._status in ready:
                data = os.read(self._status, 4096)
                if not data:
                    return ""
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("ascii", "replace")

    def _read_output(self, out: BoundedOutput) -> bool:
        """Whatever the output pipe holds now into `out`; False at its end (every writer gone)."""
        while True:
            try:
                data = os.read(self._out, _CHUNK)
            except BlockingIOError:
                return True
            if not data:
                return False
            out.add(data)

    def _drain(self, out: BoundedOutput, until: float | None) -> None:
        """The rest of the output: what is in the pipe now (None), or until every writer is gone or `until`."""
        if until is None:
            self._read_output(out)
            return
        while self._read_output(out):
            remaining = until - time.monotonic()
            if remaining <= 0 or not select.select([self._out], [], [], remaining)[0]:
                return

    def _line(self, deadline: float) -> str | None:
        """The next status line (without its newline); None if the shell ended or the deadline came first."""
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self._status], [], [], remaining)[0]:
                return None
            data = os.read(self._status, 4096)
            if not data:
                return None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")

    def kill(self) -> None:
        """End the shell at once, and its namespace with everything in it."""
        self.dead = True
        self._started()
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)

    def close(self) -> None:
        """End the shell (its stdin closed: it exits, and its namespace goes), and everything it holds; never raises."""
        self.dead = True
        self._end()
        with contextlib.suppress(OSError):
            os.close(self._command)
        self._command = -1

    def _end(self) -> None:
        """Its stdin closed, then the shell reaped (killed if it does not exit at once); its pipes closed."""
        with contextlib.suppress(OSError):
            os.close(self._req)
        self._req = -1
        self._started()
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=KILL_GRACE)
        self._close_pipes()

    def _close_pipes(self) -> None:
        for name in ("_req", "_status", "_out"):
            fd = getattr(self, name)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, name, -1)
        self._buffer = b""


class SampleShell:
    """A sandbox's one resident shell: started at its first command (again once it ended), or before it by `launch`,
    lent to one command at a time. `run` is None while another command holds it: the sandbox then runs that one
    apart.

    `make(owner)` starts the shell of `owner`, the sandbox, which is held weakly: a factory closing over the
    sandbox that holds it made every sandbox a reference cycle, freed only by the cyclic collector, whose
    collections then walked every sample in flight (bench/RESULTS.md, (10)).
    """

    def __init__(self, owner: object, make: Callable[[Any], ResidentShell]):
        self._owner = weakref.ref(owner)
        self._make = make
        self._lock = threading.Lock()
        self._shell: ResidentShell | None = None
        self.used = False  # whether a command asked for the shell (early.py learns from it)

    @property
    def current(self) -> ResidentShell | None:
        """The shell now, if one was started (it may have ended since)."""
        return self._shell

    def run(self, command: str, timeout: float) -> ExecResult | None:
        shell = self._lend()
        if shell is None:
            return None
        try:
            done = shell.run(command, timeout)
        finally:
            shell.lock.release()
        if done.timed_out:
            return ExecResult(done.output.text(), -9, timed_out=True)
        return ExecResult(done.output.text(), done.returncode)

    def launch(self) -> bool:
        """Start the shell now without waiting for it (beside the sample's first model call); whether one started.

        Never raises: a shell that cannot start says why at the first command, which starts another."""
        with self._lock:
            if self._shell is not None and not self._shell.dead:
                return False
            owner = self._owner()
            if owner is None:
                return False
            if self._shell is not None:
                self._shell.close()
                self._shell = None
            try:
                self._shell = self._make(owner)
            except (SandboxError, OSError):
                return False
            return True

    def _lend(self) -> ResidentShell | None:
        self.used = True
        with self._lock:
            if self._shell is not None and self._shell.dead:
                self._shell.close()
                self._shell = None
            if self._shell is None:
                owner = self._owner()
                if owner is None:  # its sandbox is gone: nothing is left to run a command in
                    return None
                self._shell = self._make(owner)
            return self._shell if self._shell.lock.acquire(blocking=False) else None

    def close(self) -> None:
        """Ends the shell, if there is one (the sandbox's clean-up); a later command would start another."""
        with self._lock:
            shell, self._shell = self._shell, None
        if shell is not None:
            shell.close()


class WarmsItsShell:
    """What a backend whose sandboxes hold a SampleShell says to early.py: its sandbox's `warm` and `ran_commands`
    (bwrap, local). Named before the backend's base class."""

    warms = True

    def warm(self, sandbox) -> bool:
        return sandbox.warm()

    def ran_commands(self, sandbox) -> bool | None:
        return sandbox.ran_commands
