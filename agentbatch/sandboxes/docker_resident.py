"""A sample container's resident shell: one `docker exec` that runs each of the sample's commands.

A `docker exec` per command costs the engine (and the docker SDK on the host) far more than the command:
creating the exec, attaching to it, starting a process through runc, asking for its exit code. So the
sample's first command starts one POSIX sh in the container (busybox is enough: no Python is assumed), with
its stdin attached, and every command is a request on that stdin:

- the host writes a header line (the command's line count, its tag, an end marker) and the command's lines:
  the text that `docker exec` ran before, `echo "$$"; exec 2>&1` and the command, so the command prints
  its PID first and its line numbers stay what they were;
- the shell runs it in the foreground (so that it ignores no signal) as `$shell -c`, in a session of its own
  (setsid), with the tag in its environment (BR_EXEC_ID, as each exec had) and its output into a FIFO of its
  own, which a `cat` beside it copies to the shell's stdout until every process holding it has closed it (as
  the exec's stream lasted); then it writes the end marker and the exit code;
- a timeout is what it was: the kill script (docker_container.KILL) ends what carries the command's tag.

A command may do anything in its container, to the shell too (it usually runs as the same user): a shell
that ended, or that no longer answers, fails the command at hand (SandboxError, or SandboxLost when the
container went), and the next command starts another. Where the image cannot make a FIFO, or a second
command comes while one runs (a tool's threads), the command is an exec of its own, as before. ContainerShell
is what lends the shell to one command at a time (as resident.SampleShell does for bwrap and local).
"""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import struct
import threading
import time
import weakref

from docker.utils.socket import read as socket_read

from agentbatch.sandboxes.base import ExecResult, SandboxError, SandboxLost, one_line
from agentbatch.sandboxes.docker_stream import STDOUT, close
from agentbatch.sandboxes.output import KILL_GRACE, BoundedOutput

START_TIMEOUT = 60.0
LOST_SETTLE = 5.0  # as docker_container's: how long a SIGKILLed command waits for its container's removal to show
_CHUNK = 65536
# $1: the marker of its start; $2: the shell commands run in (bash where the image has it). It speaks on fd 3
# alone (its own stdout and stderr, where a shell reports a killed job, go nowhere; the command's redirections
# are its subshell's, or they would hold while the report is written); its commands get the
# environment an exec had (no SHLVL of its own, which their shell would count one level up).
RUNNER = r"""exec 3>&1 >/dev/null 2>&1
unset SHLVL; nl='
'
s=setsid; command -v setsid >/dev/null 2>&1 || s=
printf '%s ready\n' "$1" >&3; shell=$2
while IFS= read -r head; do
  set -- $head
  c=; i=0
  while [ "$i" -lt "$1" ]; do IFS= read -r l || break; c="$c$l$nl"; i=$((i+1)); done
  c=${c%"$nl"}
  f=${TMPDIR:-/tmp}/.br-$2
  if mkfifo -m 600 "$f"; then
    cat "$f" >&3 &
    ( export BR_EXEC_ID="$2"; exec $s "$shell" -c "$c" ) </dev/null >"$f" 2>&1 3>&-; rc=$?
    wait "$!"
    rm -f "$f"
  else
    rc=nofifo
  fi
  printf '%s %s\n' "$3" "$rc" >&3
done"""


class NoFifo(Exception):
    """The image could not make the command's FIFO: its commands run as execs of their own."""


class ResidentExec:
    """The resident shell of one container: `run` one command at a time (holding `lock`); ends with the container."""

    def __init__(self, sandbox):
        """`sandbox`: the DockerSandbox whose container it runs in (its execs, kill script and lost-container check)."""
        self.lock = threading.Lock()
        self.dead = False
        self._box = sandbox
        self._pending = bytearray()  # bytes of the stream not yet split into frames
        self._errors = BoundedOutput(keep=4096)
        start = secrets.token_hex(16)
        self._exec_id, self._sock = sandbox._start_exec(
            ["sh", "-c", RUNNER, "sh", start, sandbox.shell], user=getattr(sandbox, "user", ""), stdin=True
        )
        self._raw = getattr(self._sock, "_sock", self._sock)
        out = BoundedOutput(keep=4096)
        found = self._until(start.encode(), out, time.monotonic() + START_TIMEOUT)
        if found != b"ready":
            self.close()
            said = one_line(f"{out.text()} {self._errors.text()}") or "it ended at once"
            raise SandboxError(f"the container's shell did not start: {said}")

    def run(self, command: str, tag: str, timeout: float) -> ExecResult:
        """One command (the text docker_container.exec would have run), tagged `tag`; NoFifo if the image has none."""
        if "\0" in command:
            raise ValueError("embedded null byte")
        if self.dead:
            raise SandboxError("the container's shell has ended")
        end = secrets.token_hex(16)
        lines = command.split("\n")
        request = f"{len(lines)} {tag} {end}\n{command}\n".encode("utf-8", "surrogateescape")
        try:
            self._raw.sendall(request)
        except OSError:
            self.dead = True
            self._box._raise_if_lost()
            raise SandboxError("the container's shell ended before the command could start") from None
        out = BoundedOutput()
        code = self._until(end.encode(), out, time.monotonic() + max(float(timeout), 0.1))
        timed_out = code is None
        if timed_out:
            pid = out.take_first_line()
            self._box._kill(tag, pid)
            code = self._until(end.encode(), out, time.monotonic() + KILL_GRACE)
            if code is None:  # something it started still holds its output: the shell goes, and the next is new
                self.kill()
        else:
            out.take_first_line()
        if code == b"nofifo":
            raise NoFifo(self._errors.text())
        if code == b"":
            self.dead = True
            self._box._raise_if_lost(settle=LOST_SETTLE)  # a forced removal ends the stream before the engine says so
            said = one_line(self._errors.text(), 120)
            raise SandboxError(
                "the container's shell ended while the command ran"
                + (f" ({said})" if said else "")
                + "; the next command gets a new one"
            )
        if timed_out:
            self._box._raise_if_lost()
            return ExecResult(out.text(), -9, timed_out=True)
        rc = int(code) if code and code.isdigit() else -1
        if rc == 137:  # SIGKILLed: by its own doing, or because its container went away
            self._box._raise_if_lost(settle=LOST_SETTLE)
        return ExecResult(out.text(), rc)

    def _until(self, marker: bytes, out: BoundedOutput, deadline: float) -> bytes | None:
        """Stdout into `out` until `marker` and its line's rest (returned; b"" if the stream ended), None at the deadline."""
        held = bytearray()  # stdout that may be the start of the marker
        while True:
            while len(self._pending) >= 8:
                size = struct.unpack(">L", self._pending[4:8])[0]
                if len(self._pending) < 8 + size:
                    break
                stream, data = self._pending[0], bytes(self._pending[8 : 8 + size])
                del self._pending[: 8 + size]
                if stream != STDOUT:
                    self._errors.add(data)
                    continue
                held += data
                at = held.find(marker)
                if at >= 0:
                    out.add(bytes(held[:at]))
                    rest = bytes(held[at + len(marker) :])
                    return self._rest_of_line(rest, deadline)
                keep = len(marker) - 1
                if len(held) > keep:
                    out.add(bytes(held[: len(held) - keep]))
                    del held[: len(held) - keep]
            if not self._read(deadline):
                out.add(bytes(held))
                return None if time.monotonic() >= deadline else b""

    def _rest_of_line(self, rest: bytes, deadline: float) -> bytes | None:
        """The marker line's rest (" <code>\\n"), reading more frames if it is not all there."""
        while b"\n" not in rest:
            if len(self._pending) >= 8:
                size = struct.unpack(">L", self._pending[4:8])[0]
                if len(self._pending) >= 8 + size:
                    stream, data = self._pending[0], bytes(self._pending[8 : 8 + size])
                    del self._pending[: 8 + size]
                    if stream == STDOUT:
                        rest += data
                    else:
                        self._errors.add(data)
                    continue
            if not self._read(deadline):
                return None if time.monotonic() >= deadline else b""
        line, _, after = rest.partition(b"\n")
        if after.strip():
            self.kill()  # output after the end: the shell no longer speaks the protocol
        return line.strip()

    def _read(self, deadline: float) -> bool:
        """More bytes of the stream into the pending buffer; False at its end or at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([self._sock], [], [], remaining)[0]:
            return False
        try:
            data = socket_read(self._sock, _CHUNK)
        except OSError:
            data = b""
        if not data:
            self.dead = True
            return False
        self._pending += data
        return True

    def alive(self) -> bool:
        """Whether the shell still runs, as far as its stream says (an idle shell's ended stream reads at once)."""
        if not self.dead and select.select([self._sock], [], [], 0)[0]:
            self._read(time.monotonic() + 1.0)
        return not self.dead

    def kill(self) -> None:
        """End the shell (the container's processes it started stay, as an exec's did); the next command makes one."""
        self.dead = True
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_WR)
        close(self._sock)

    def close(self) -> None:
        self.kill()


class ContainerShell:
    """A sandbox's one resident shell, lent to one command at a time: started at its first command (again once it
    ended), never again once the image could not have one. `run` is None where a command cannot have it (another
    holds it, or the image makes no FIFO): the sandbox then runs that one in an exec of its own."""

    def __init__(self, sandbox):
        """`sandbox`: the DockerSandbox whose container the shell runs in (ResidentExec's), held weakly: it holds
        this, so a strong reference made every docker sample's sandbox a cycle for the cyclic collector (as the
        resident shell's factory did in bwrap and local, bench/RESULTS.md (10))."""
        self._box = weakref.proxy(sandbox)
        self._lock = threading.Lock()
        self._shell: ResidentExec | None = None
        self.refused = False  # the image cannot make a FIFO, or its shell would not start

    def run(self, command: str, tag: str, timeout: float) -> ExecResult | None:
        """One command (ResidentExec.run's), or None where the shell is not free (see the class)."""
        shell = self._lend()
        if shell is None:
            return None
        try:
            return shell.run(command, tag, timeout)
        except NoFifo:
            self.refused = True
            return None
        finally:
            shell.lock.release()

    def _lend(self) -> ResidentExec | None:
        """The shell, locked for one command (started now if there is none, or it ended); None while another
        command holds it, or where the image cannot have one."""
        with self._lock:
            if self.refused or not self._box.container_id:
                return None
            if self._shell is not None and not self._shell.alive():
                self._shell.close()
                self._shell = None
            if self._shell is None:
                try:
                    self._shell = ResidentExec(self._box)
                except SandboxLost:
                    raise
                except SandboxError:
                    self.refused = True
                    return None
            return self._shell if self._shell.lock.acquire(blocking=False) else None

    def end(self) -> None:
        """End the shell once the command holding it is done (before one that kills every process); the next
        command starts another."""
        with self._lock:
            shell, self._shell = self._shell, None
        if shell is not None:
            with shell.lock:
                shell.close()

    def close(self) -> None:
        """End the shell at once (the sandbox's clean-up)."""
        with self._lock:
            shell, self._shell = self._shell, None
        if shell is not None:
            shell.close()
