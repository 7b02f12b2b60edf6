"""The user's cache directory: where the runner keeps what outlives a run (the entry points found, model replies)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path | None:
    """`$XDG_CACHE_HOME/batch-runner` (an absolute one, as the XDG spec says), else `~/.cache/batch-runner`; None
    without a home directory to find."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    try:
        parent = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    except RuntimeError:
        return None
    return parent / "batch-runner"
