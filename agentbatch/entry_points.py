"""The installed packages' entry points in the plug-in groups: found with importlib.metadata, remembered on disk.

importlib.metadata reads the entry points of every installed distribution: ~50 ms of CPU in a fresh
interpreter with 256 of them (its own import ~23 ms), 8 times the scan of their files this replaced and a
sixth of the runner's fixed start-up (bench (20), (9)); a cached answer takes a few ms. What it found is kept
in the user's cache directory (`$XDG_CACHE_HOME/batch-runner/`, else `~/.cache/...`), a file per interpreter
and import path, keyed by the distributions in each folder on sys.path and the time each one's
entry_points.txt was written: a distribution installed, removed, upgraded, reinstalled or edited in place
changes that, and the next start looks again (other files coming and going in those folders do not). A
cache that cannot be read or written is only not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

CACHE_VERSION = 2
KEPT = 64  # cache files kept: one per import path (checkouts, virtual environments, tests' temporary paths)


def find(groups: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(group, name, value) of every entry point in `groups`, by group then name; value is `module[:attribute]`.

    The first distribution of a name on sys.path counts, as for imports (importlib.metadata's rule).
    """
    key = _key(groups)
    path = _cache_file(key)
    found = _read(path, key) if path is not None else None
    if found is None:
        found = _scan(groups)
        if path is not None:
            _write(path, key, found)
    return found


def _scan(groups: tuple[str, ...]) -> list[tuple[str, str, str]]:
    import importlib.metadata

    every = importlib.metadata.entry_points()
    found = []
    for group in groups:
        for ep in every.select(group=group):
            found.append((group, ep.name, f"{ep.module}:{ep.attr}" if ep.attr else ep.module))
    return sorted(found)


def _key(groups: tuple[str, ...]) -> list:
    """What the answer depends on: the groups asked for, and for each folder on sys.path the distributions in it,
    each with the time its entry_points.txt was last written (one stat each: ~1 ms for 256 distributions)."""
    folders = []
    for folder in sys.path:
        where = os.path.abspath(folder or ".")  # "" and "." are the working directory
        try:
            entries = os.scandir(where)
        except OSError:  # a zip file, a path hook's name, a folder not there
            folders.append([where, _mtime(where)])
            continue
        with entries:
            dists = [
                [e.name, _mtime(os.path.join(e.path, "entry_points.txt") if e.is_dir() else e.path)]
                for e in entries
                if e.name.endswith((".dist-info", ".egg-info"))
            ]
        folders.append([where, sorted(dists)])
    return [CACHE_VERSION, list(groups), folders]


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _cache_file(key: list) -> Path | None:
    """The cache file of this interpreter and import path (a test's or a second checkout's path has its own, so
    two of them do not take turns rewriting one file)."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    try:
        root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:  # no home directory to find
        return None
    which = [os.path.realpath(sys.executable), *(folder for folder, _ in key[2])]
    name = hashlib.sha256("\0".join(which).encode()).hexdigest()[:16]
    return root / "batch-runner" / f"entry_points-{name}.json"


def _read(path: Path, key: list) -> list[tuple[str, str, str]] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data["key"] != key:
            return None
        return [(str(g), str(n), str(v)) for g, n, v in data["found"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, key: list, found: list[tuple[str, str, str]]) -> None:
    """Replace the cache whole (another start may read it meanwhile); a failure leaves no cache, and no error."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".entry_points-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"key": key, "found": found}, f)
            os.replace(tmp, path)
        except OSError:
            os.unlink(tmp)
            raise
        _prune(path.parent)


def _prune(folder: Path) -> None:
    """At most KEPT cache files (one per import path seen), the least recently written removed first."""
    files = sorted(folder.glob("entry_points-*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for old in files[KEPT:]:
        old.unlink(missing_ok=True)
