"""A sample's final state (--keep_final_state, docs/replay.md): its sandbox's files as its agent left them, kept
after the agent's last turn and before the check, and put into a fresh sandbox to check the sample again
(--rescore) without running its agent again.

One file per sample: an uncompressed tar of `manifest.json` (what the state came from: its backend, image and
working directory, and what the backend needs to restore it) and `files.tar.gz`, the backend's own archive of the
files (Backend.save_state: a work directory, or what changed in a container). The worker writes it in the
session's staging directory, outside the run directory; the session moves it into the run's final_state/ as it
records the sample's line, whose `final_state` names it (run_dir/recorder.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tarfile
import tempfile
from dataclasses import dataclass

from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import Sandbox, SandboxError, SandboxSpec
from agentbatch.tools.context import ToolContext

log = logging.getLogger(__name__)

VERSION = 1
MAX_STATE_BYTES = 256 * 1024 * 1024  # compressed; a state past it is not kept (its line's final_state is null)
MANIFEST, FILES = "manifest.json", "files.tar.gz"


@dataclass(frozen=True)
class Manifest:
    """Where a kept state came from, and what restoring it needs."""

    backend: str
    image: str | None
    cwd: str | None
    fresh: bool  # the sample never made its sandbox: its state is a fresh one's
    notes: dict  # what the backend's save_state returned for its restore_state

    def to_json(self) -> bytes:
        return json.dumps({"version": VERSION, **self.__dict__}).encode()


def keep(ctx: ToolContext, spec: SandboxSpec, staging: str | None) -> str | bytes | None:
    """The sample's state now, staged as a file in `staging` (its path), or its bytes where the worker has no such
    directory (a Ray node elsewhere); None when it cannot be kept (said in the worker's log). Never raises."""
    if spec.kind == "local" and spec.cwd:  # the row's own directory on this machine: not the sample's to keep
        log.info("final state not kept: a local sandbox in the row's cwd %s is this machine's directory", spec.cwd)
        return None
    staged = staging if staging and os.path.isdir(staging) else None
    try:
        fd, path = tempfile.mkstemp(prefix=".state-", suffix=".tar", dir=staged)
        os.close(fd)
    except OSError as e:
        log.warning("final state not kept: %s", e)
        return None
    try:
        _write(ctx, spec, path)
        if staged:
            return path
        with open(path, "rb") as f:
            return f.read()
    except (SandboxError, OSError, TimeoutError) as e:
        log.warning("final state of a sample not kept: %s", e)
        staged = None
        return None
    finally:
        if not staged:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _write(ctx: ToolContext, spec: SandboxSpec, path: str) -> None:
    fresh = not ctx.has_sandbox
    notes: dict = {}
    with tempfile.TemporaryFile(dir=os.path.dirname(path)) as files:
        if not fresh:
            backend = sandbox_backends.get(spec.kind)
            notes = backend.save_state(ctx.sandbox(), files, MAX_STATE_BYTES)
        size = files.tell()
        files.seek(0)
        manifest = Manifest(spec.kind, spec.image, spec.cwd, fresh, notes).to_json()
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
            _add(tar, MANIFEST, io.BytesIO(manifest), len(manifest))
            _add(tar, FILES, files, size)


def _add(tar: tarfile.TarFile, name: str, data, size: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o600
    tar.addfile(info, data)


def manifest(path: str) -> Manifest:
    """A kept state's manifest (SandboxError if the file is not a kept state)."""
    try:
        with tarfile.open(path, "r:") as tar:
            member = tar.extractfile(MANIFEST)
            data = json.loads(member.read()) if member is not None else None
    except (OSError, KeyError, tarfile.TarError, ValueError) as e:
        raise SandboxError(f"{os.path.basename(path)} is not a kept final state ({e})") from e
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("backend"), str):
        raise SandboxError(f"{os.path.basename(path)} is not a kept final state of this version")
    notes = data.get("notes") if isinstance(data.get("notes"), dict) else {}
    return Manifest(data["backend"], data.get("image"), data.get("cwd"), bool(data.get("fresh")), notes)


def restore(sandbox: Sandbox, path: str, kept: Manifest) -> None:
    """Put the kept files into a fresh sandbox of the same backend (SandboxError if they cannot be)."""
    if kept.fresh:
        return
    try:
        with tarfile.open(path, "r:") as tar:
            files = tar.extractfile(FILES)
            if files is None:
                raise SandboxError(f"{os.path.basename(path)} holds no {FILES}")
            sandbox_backends.get(kept.backend).restore_state(sandbox, files, kept.notes)
    except (OSError, KeyError, tarfile.TarError) as e:
        raise SandboxError(f"cannot read the kept state {os.path.basename(path)}: {e}") from e
