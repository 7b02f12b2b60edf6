"""Which backend each sample's sandbox comes from, decided once per session: from `--sandbox`, `TERMINAL_ENV`,
whether bwrap works here (its probe) and whether the row names an image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agentbatch.errors import FatalError
from agentbatch.sandboxes import registry
from agentbatch.sandboxes.base import SandboxError, SandboxSettings

AUTO = "auto"  # bwrap if it works here, else local
IMAGES = "docker"  # where a row's image runs when the run's backend takes none


def choose(
    flag: str | None, environ: Mapping[str, str], settings: SandboxSettings, images: bool = False
) -> tuple[SandboxSettings, str]:
    """The run's settings with its backends chosen, and the one line that says which (printed as the session starts).

    `flag` is the --sandbox value (None: not given); `images`: whether any row names an image.
    Each chosen backend's `prepare_run` runs here, once; FatalError when the one asked for cannot run.
    """
    if flag is not None and flag not in registry.names():
        raise FatalError(f"--sandbox must be one of {', '.join(registry.names())}, got {flag!r}")
    asked = flag or _from_environment(environ)
    if asked == AUTO:
        try:
            kind, note = "bwrap", registry.get("bwrap").prepare_run(replace(settings, kind="bwrap"))
        except SandboxError as e:
            kind, note = "local", _prepared("local", settings, ["docker"], because=str(e))
    else:
        kind = asked
        others = [name for name in registry.names() if name != kind]
        note = _prepared(kind, settings, others, prefix=f"--sandbox={kind}: ")
    image_kind = kind if registry.get(kind).takes_images else IMAGES
    if images and image_kind != kind:
        _prepared(image_kind, settings, [], prefix="rows with an image: ")
    return replace(settings, kind=kind, image_kind=image_kind), note


def _from_environment(environ: Mapping[str, str]) -> str:
    value = environ.get("TERMINAL_ENV")
    kind = (value or "").strip().lower() or AUTO
    if kind != AUTO and kind not in registry.names():
        raise FatalError(
            f"TERMINAL_ENV must be {', '.join(registry.names())}, got {value!r}; unset it or pass --sandbox"
        )
    return kind


def _prepared(kind: str, settings: SandboxSettings, others: list[str], prefix: str = "", **why) -> str:
    """The backend's prepare_run; FatalError naming what to use instead if it cannot run here."""
    try:
        return registry.get(kind).prepare_run(replace(settings, kind=kind), **why)
    except SandboxError as e:
        instead = f"; use {' or '.join(f'--sandbox={o}' for o in others)}" if others else ""
        raise FatalError(f"{prefix}{e}{instead}") from None
