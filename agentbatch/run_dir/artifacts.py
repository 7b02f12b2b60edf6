"""The files a sample's check kept (a Harbor task's artifacts): written by the runner, read by the report.

A worker returns them with the sample's outcome (bounded: harbor/artifacts.py), and the runner, the run
directory's one writer, puts them in `artifacts/<prompt index>-<sample index>/` before the sample's line,
replacing what an earlier attempt of that sample left there. Each path is taken as relative to that folder and
must stay inside it; the run's secrets are redacted from the bytes as from every line.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

from agentbatch.run_dir.paths import RunPaths


def write(
    paths: RunPaths, prompt_index: int, sample_index: int, files: list[tuple[str, bytes]], redact: Callable[[str], str]
) -> None:
    """Write one sample's files into its folder, replacing the folder (raises OSError)."""
    folder = paths.artifacts(prompt_index, sample_index)
    if os.path.lexists(folder):
        shutil.rmtree(folder) if os.path.isdir(folder) and not os.path.islink(folder) else os.remove(folder)
    for rel, data in files:
        target = _inside(folder, rel)
        if target is None:
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        text = data.decode("utf-8", "surrogateescape")
        redacted = redact(text)
        with open(target, "wb") as f:
            f.write(data if redacted is text else redacted.encode("utf-8", "surrogateescape"))


def listed(paths: RunPaths) -> dict[tuple[int, int], list[str]]:
    """(prompt index, sample index) -> the files kept for that sample, relative to its folder, sorted."""
    out: dict[tuple[int, int], list[str]] = {}
    root = paths.artifacts()
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        first, _, second = name.partition("-")
        if not (first.isdigit() and second.isdigit()):
            continue
        folder = os.path.join(root, name)
        found = []
        for top, dirs, files in os.walk(folder):
            dirs.sort()
            found += [os.path.relpath(os.path.join(top, f), folder) for f in sorted(files)]
        out[(int(first), int(second))] = found
    return out


def _inside(folder: str, rel: str) -> str | None:
    parts = [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return os.path.join(folder, *parts)
