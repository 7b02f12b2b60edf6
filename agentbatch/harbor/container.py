"""What the runner does in a Harbor task's container around the agent (docs/harbor.md, "A sample").

Before the agent's first command, `probe` notes what the tests will run with: the shell's PATH and where
`bash` is, as the image has them (the agent may put another `bash` first on that PATH later). After its
last turn, `end_processes` kills everything still running in the container but its PID 1, so nothing the
agent left behind runs during the check; `put_dir` copies a task's directory in, streamed.
"""

from __future__ import annotations

import os
import shlex
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from agentbatch.harbor.task_fields import Healthcheck
from agentbatch.sandboxes.base import SANDBOX_ENV, Sandbox, SandboxError

COMMAND_TIMEOUT = 120.0
CHUNK = 1 << 20
# Builtins and /proc only: what the agent left on disk (a `kill` or `ps` of its own) is never run. Every
# process but PID 1 (the container's idle loop) and this shell is killed, again until none is left; the
# idle loop's own `sleep`, which it starts again at once, does not keep the passes going. Only where PID 1 is
# that idle loop (docker_container.KEEPALIVE): anywhere else "every process" could be more than the agent's.
END_PROCESSES = r"""one=""; read -r one < /proc/1/cmdline 2>/dev/null
case "$one" in *"trap 'exit 0' TERM"*) ;; *) echo "PID 1 is not the sandbox container's idle loop"; exit 3;; esac
me=$$; since=""
if read -r l < /proc/$$/stat; then set -- ${l##*") "}; since=${20}; fi
pass=0
while [ "$pass" -lt 50 ]; do
  pass=$((pass + 1)); hit=""; others=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    [ "$p" = 1 ] && continue
    [ "$p" = "$me" ] && continue
    read -r l 2>/dev/null < "$d/stat" || continue
    c=${l#*\(}; c=${c%\)*}
    set -- ${l##*") "}
    case $1 in Z|X) continue;; esac
    hit="$hit $p"
    if [ "$2" = 1 ] && [ "$c" = sleep ] && [ -n "$since" ] && [ "${20}" -ge "$since" ]; then continue; fi
    others=$((others + 1))
  done
  [ -n "$hit" ] && kill -9 $hit 2>/dev/null
  [ "$others" = 0 ] && break
done
echo "ended $pass"
"""
# What the tests are run with, read before the agent's first command: the image's bash, else its sh (the second
# line: uid and gid, so that the copied files are the image user's, as the agent's own are).
PROBE = r"""b=$(command -v bash) || b=""; case "$b" in /*) echo "$b";; *) echo /bin/sh;; esac
u=0; g=0
while read -r k a b; do case $k in Uid:) u=$a;; Gid:) g=$a;; esac; done < /proc/self/status
echo "$u $g"
printf '%s' "$PATH"
"""


@dataclass(frozen=True)
class Probe:
    """The container as the image made it: the interpreter and PATH the tests run with, and whose files are."""

    bash: str = "/bin/bash"
    path: str = SANDBOX_ENV["PATH"]
    uid: int = 0
    gid: int = 0


def probe(sandbox: Sandbox) -> Probe:
    """Read before the agent's first command; SandboxError if the container cannot run it."""
    done = sandbox.exec(PROBE, timeout=COMMAND_TIMEOUT)
    lines = done.output.split("\n")
    if done.timed_out or done.exit_code != 0 or len(lines) < 3:
        raise SandboxError(f"the container cannot run sh: {' '.join(done.output.split())[-300:]}")
    bash = lines[0].strip()
    ids = lines[1].split()
    path = "\n".join(lines[2:])
    return Probe(
        bash=bash if bash.startswith("/") else "/bin/sh",
        path=path if path and "\n" not in path else SANDBOX_ENV["PATH"],
        uid=int(ids[0]) if ids and ids[0].isdigit() else 0,
        gid=int(ids[1]) if len(ids) > 1 and ids[1].isdigit() else 0,
    )


def end_processes(sandbox: Sandbox) -> None:
    """Kill every process the agent left running in the container (its commands, servers, loops, and the shell
    that ran its commands), as root: in an exec of its own, which the kill spares."""
    run(sandbox, END_PROCESSES, alone=True)


def exec_as(sandbox: Sandbox, command: str, timeout: float, user: str | None = None, alone: bool = False):
    """A command as `user` (a name or uid; "" the image's user; None the sandbox's own, the agent's). Only a
    container has users to choose from; elsewhere the command runs as the sandbox's commands do. `alone`: in an
    exec of its own, the container's resident shell ended first (a command that kills every process)."""
    exec_ = getattr(sandbox, "exec_alone", sandbox.exec) if alone else sandbox.exec
    if user is None or not getattr(sandbox, "container_id", None):
        return exec_(command, timeout=timeout)
    return exec_(command, timeout=timeout, user=user)


def run(
    sandbox: Sandbox, command: str, timeout: float = COMMAND_TIMEOUT, user: str | None = "0", alone: bool = False
) -> str:
    """A command of ours in the container, as root unless `user` says; SandboxError unless it exits 0."""
    done = exec_as(sandbox, command, timeout, user, alone)
    if done.timed_out or done.exit_code != 0:
        first = command.strip().splitlines()[0][:80]
        raise SandboxError(f"{first!r} failed in the container: {' '.join(done.output.split())[-300:]}")
    return done.output


def put_dir(sandbox: Sandbox, source: str, target: str, owner: Probe, replace: bool = True) -> None:
    """Put a task's directory at `target` (anything there before removed, unless not `replace`), executable bits
    kept, files owned by the image's user; streamed as a tar to a container, so no file is held whole in memory."""
    clear = f"rm -rf {shlex.quote(target)} && " if replace else ""
    run(sandbox, f"{clear}mkdir -p {shlex.quote(target)}")
    container = getattr(sandbox, "container_id", None)
    if container is None:  # not a container: file by file (Harbor tasks run in Docker; this is for other sandboxes)
        for rel, path in _files(source):
            with open(path, "rb") as f:
                sandbox.write_file(f"{target}/{rel}", f.read())
            if os.stat(path).st_mode & 0o111:
                run(sandbox, f"chmod +x {shlex.quote(f'{target}/{rel}')}")
        return
    from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

    try:
        client().api.put_archive(container, target, _tar_stream(source, owner))
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot copy {os.path.basename(source)}/ into the container: {message(e)}") from e


def _files(source: str) -> Iterator[tuple[str, str]]:
    """(path relative to source, full path) of every file under source, sorted; a symlink is its target's file."""
    for top, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            yield os.path.relpath(path, source), path


def _tar_stream(source: str, owner: Probe) -> Iterator[bytes]:
    """The tar of source's files, made by a thread as it is read: its memory is a pipe's, whatever the files."""
    read_end, write_end = os.pipe()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_end, "wb") as out, tarfile.open(fileobj=out, mode="w|", bufsize=CHUNK) as tar:
                made: set[str] = set()
                for rel, path in _files(source):
                    _add_dirs(tar, rel, made, owner)
                    with open(path, "rb") as f:  # a symlink was checked to lead inside the task: its file is copied
                        st = os.fstat(f.fileno())
                        info = tarfile.TarInfo(rel)
                        info.size, info.mtime = st.st_size, int(st.st_mtime)
                        info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                        info.uid, info.gid = owner.uid, owner.gid
                        tar.addfile(info, f)
        except BrokenPipeError:  # the engine stopped reading: its error is the one raised
            pass
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=write, name="harbor-tar", daemon=True)
    thread.start()
    with os.fdopen(read_end, "rb") as inp:
        while chunk := inp.read(CHUNK):
            yield chunk
    thread.join()
    if failed:
        raise OSError(f"cannot read {source}: {failed[0]}")


def _add_dirs(tar: tarfile.TarFile, rel: str, made: set[str], owner: Probe) -> None:
    parts = rel.split(os.sep)[:-1]
    for i in range(1, len(parts) + 1):
        name = "/".join(parts[:i])
        if name not in made:
            made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, owner.uid, owner.gid
            tar.addfile(info)


def healthcheck(sandbox: Sandbox, hc: Healthcheck) -> None:
    """[environment] healthcheck, as Harbor runs it (and Docker's HEALTHCHECK counts): until the command exits 0;
    failures within the start period do not count; `retries` in a row after it fail the sample."""
    started = time.monotonic()
    failures = 0
    while True:
        done = exec_as(sandbox, hc.command, hc.timeout, "")
        if done.exit_code == 0 and not done.timed_out:
            return
        if time.monotonic() < started + hc.start_period:
            time.sleep(hc.start_interval)
            continue
        failures += 1
        if failures >= hc.retries:
            last = (done.output.strip().splitlines() or [""])[-1][-200:]
            said = f" (exit {done.exit_code}: {last})" if last else f" (exit {done.exit_code})"
            raise SandboxError(f"the task's healthcheck failed {hc.retries} time(s) in a row: {hc.command!r}{said}")
        time.sleep(hc.interval)
