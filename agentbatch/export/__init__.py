"""Exports of a run directory into the formats of trainers and viewers (docs/export.md); see run_export.export."""

from __future__ import annotations

import importlib.util

from agentbatch.errors import FatalError

INSTALL_HINT = "pip install 'batch-runner[export]' (from a checkout: pip install -e '.[export]')"
# Format name → (module under agentbatch.export, the optional packages it needs).
FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "openai": ("openai_chat", ()),
    "llama_factory": ("llama_factory", ()),
    "hermes": ("hermes", ()),
    "atif": ("atif_files", ("atif",)),
    "parquet": ("parquet_shards", ("pyarrow",)),
    "inspect": ("inspect_log", ("inspect_ai",)),
    "tokens": ("token_rows", ("pyarrow",)),
}


def check_formats(name: str, values: tuple[str, ...]) -> tuple[str, ...]:
    """The --export value: known formats whose packages are installed, in the order given, once each."""
    out: list[str] = []
    for value in values:
        fmt = value.lower()
        if fmt not in FORMATS:
            raise FatalError(f"--{name}: unknown format {value!r}; choose from {', '.join(FORMATS)}")
        missing = [p for p in FORMATS[fmt][1] if not _installed(p)]
        if missing:
            raise FatalError(f"--{name}={fmt} needs {', '.join(missing)}: {INSTALL_HINT}")
        if fmt not in out:
            out.append(fmt)
    return tuple(out)


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (blocked)
        return False
