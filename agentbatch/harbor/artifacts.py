"""A task's artifacts: what is collected from its containers after the agent (Harbor's trial/artifact_handler.py).

`/logs/artifacts` always (Harbor's convention entry), then each entry of the task's `artifacts`, from its service
(main unless it says), best effort: one that is missing or fails is noted, never the sample's failure. Each lands
where Harbor puts it under the trial's artifacts/: its `destination`, else its source path without the leading
/ (`/app/out.log` -> `app/out.log`); an entry whose place overlaps one taken before is skipped, and
`manifest.json` lists every entry with its status (ok, empty, failed, skipped). A separate verifier gets each
collected entry back at its source path, and nothing else of the agent's container.

The files travel to the runner with the sample's outcome, which writes them into the run directory
(run_dir/paths.py, `artifacts`): a worker never writes there. So they are bounded: MAX_BYTES a sample in all;
an entry that would pass it is skipped, saying so.
"""

from __future__ import annotations

import fnmatch
import io
import json
import posixpath
import shlex
import tarfile
from dataclasses import dataclass, field

from agentbatch.harbor.task_fields import CONVENTION_ARTIFACTS, MAIN, Artifact
from agentbatch.sandboxes.base import Sandbox, SandboxError

MAX_BYTES = 16 * 1024 * 1024  # every artifact of one sample, together
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


@dataclass
class Collected:
    """What was collected of one sample: the files (path under its artifacts folder, bytes) and the manifest."""

    files: list[tuple[str, bytes]] = field(default_factory=list)
    manifest: list[dict] = field(default_factory=list)
    by_entry: dict[int, list[tuple[str, bytes, bool]]] = field(default_factory=dict)  # entry -> (relative, data, dir?)
    size: int = 0

    def output(self) -> list[tuple[str, bytes]]:
        """The files for the run directory, the manifest with them."""
        manifest = json.dumps(self.manifest, indent=1, ensure_ascii=False).encode()
        return [*self.files, (MANIFEST, manifest + b"\n")]


def entries(task_artifacts: list[Artifact]) -> list[Artifact]:
    """The task's entries with the convention entry first, unless the task declares that path for main itself."""
    declared = any(a.source.rstrip("/") == CONVENTION_ARTIFACTS and a.service == MAIN for a in task_artifacts)
    return list(task_artifacts) if declared else [Artifact(CONVENTION_ARTIFACTS), *task_artifacts]


def host_path(entry: Artifact) -> str:
    """Where an entry lands under the sample's artifacts folder (Harbor's artifact_host_path)."""
    raw = entry.destination or entry.source
    parts = [p for p in raw.split("/") if p not in ("", ".", "..")]
    return "/".join(parts) or "."


def collect(sandboxes, task_artifacts: list[Artifact], services: set[str], into: Collected) -> None:
    """Collect the entries of `services` into `into`; `sandboxes(service)` gives a service's sandbox."""
    claimed = [m["destination"] for m in into.manifest if m["status"] != "skipped"]
    for i, entry in enumerate(entries(task_artifacts)):
        if entry.service not in services:
            continue
        target = host_path(entry)
        record = {"source": entry.source, "destination": target, "type": "file", "status": "ok"}
        record["service"] = None if entry.service == MAIN else entry.service
        into.manifest.append(record)
        if any(_overlap(target, other) for other in claimed):
            record["status"] = "skipped"
            continue
        claimed.append(target)
        try:
            found, is_dir = _download(sandboxes(entry.service), entry, MAX_BYTES - into.size)
        except _TooBig:
            record["status"], record["note"] = "skipped", f"over the {MAX_BYTES}-byte limit of a sample's artifacts"
            continue
        except (SandboxError, OSError, tarfile.TarError) as e:
            record["status"], record["note"] = "failed", str(e)[:200]
            continue
        record["type"] = "directory" if is_dir else "file"
        if is_dir and not found:
            record["status"] = "empty"
        into.by_entry[i] = [(rel, data, is_dir) for rel, data in found]
        for rel, data in found:
            into.files.append((posixpath.normpath(posixpath.join(target, rel)) if rel else target, data))
            into.size += len(data)


class _TooBig(Exception):
    pass


def _download(sandbox: Sandbox, entry: Artifact, budget: int) -> tuple[list[tuple[str, bytes]], bool]:
    """(path relative to the entry, bytes) of each regular file at the entry's source, and whether it is a directory."""
    container = getattr(sandbox, "container_id", None)
    if container is None:
        raise SandboxError("artifacts are collected from containers only")
    from agentbatch.sandboxes.docker_engine import ENGINE_ERRORS, client, message

    path = entry.source if entry.source.startswith("/") else posixpath.join(sandbox.workdir, entry.source)
    try:
        chunks, stat = client().api.get_archive(container, path, chunk_size=_CHUNK)
    except ENGINE_ERRORS as e:
        raise SandboxError(f"cannot read {path}: {message(e)}") from e
    data = bytearray()
    for chunk in chunks:
        data += chunk
        if len(data) > budget + (1 << 20):  # the tar's headers are small next to this margin
            getattr(chunks, "close", lambda: None)()
            raise _TooBig()
    is_dir = bool(stat.get("mode", 0) & (1 << 31))
    out, size = [], 0
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
        for member in tar:
            rel = member.name.split("/", 1)[1] if is_dir and "/" in member.name else "" if not is_dir else None
            if rel is None or not member.isfile() or _excluded(rel, entry.exclude):
                continue
            body = tar.extractfile(member).read()
            size += len(body)
            if size > budget:
                raise _TooBig()
            out.append((rel, body))
    return out, is_dir


def _excluded(rel: str, patterns: tuple[str, ...]) -> bool:
    """tar --exclude: a pattern matches the path, or any of its trailing parts (GNU tar's unanchored default)."""
    parts = rel.split("/")
    tails = ["/".join(parts[i:]) for i in range(len(parts))] + parts
    return any(fnmatch.fnmatch(t, p.rstrip("/")) for p in patterns for t in tails)


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or "." in (a, b)


def restore(sandbox: Sandbox, task_artifacts: list[Artifact], collected: Collected) -> None:
    """Put each collected entry back at its source path in a separate verifier's container (parents made)."""
    from agentbatch.harbor import container

    for i, entry in enumerate(entries(task_artifacts)):
        files = collected.by_entry.get(i)
        if files is None:
            continue
        source = entry.source.rstrip("/") or "/"
        if any(is_dir for _, _, is_dir in files) or not files:
            container.run(sandbox, f"rm -rf {shlex.quote(source)} && mkdir -p {shlex.quote(source)}")
        for rel, data, is_dir in files:
            sandbox.write_file(posixpath.join(source, rel) if is_dir else source, data)
