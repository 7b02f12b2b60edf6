"""Dataset formats: what `--dataset_file` may name, and the one function that reads it (docs/datasets.md).

A format is a class registered with `@dataset_format("name")` (built-in: `jsonl`, agentbatch/dataset_jsonl.py;
plug-ins register theirs the same way, agentbatch/plugins.py) in the one Registry of formats, FORMATS. It
answers `claims(path)`: whether the path is a dataset of its kind, and `load(path, max_samples)`: the valid
entries (dataset.Entry), at most `max_samples` of them, and one warning per skipped row. A dataset that cannot be used at all raises
DatasetError (one line, exit 2). The formats registered last are asked first, so a plug-in can claim
what a built-in would; `jsonl` claims whatever no other does.
"""

from __future__ import annotations

from typing import Protocol

from agentbatch.dataset import DatasetError, Entry
from agentbatch.registry import Registry, origin_of


class DatasetFormat(Protocol):
    """A kind of dataset; one instance serves the run. It may also have steps in the runner, each optional:
    `prepare(entries, run)`, `at_end(entries, run) -> lines` and `sandbox_note` (dataset_steps.py)."""

    name: str

    def claims(self, path: str) -> bool:
        """Whether `path` is a dataset of this format (asked before load, cheaply: a name, a marker file)."""

    def load(self, path: str, max_samples: int | None) -> tuple[list[Entry], list[str]]:
        """The valid entries (the first `max_samples`) and one warning per skipped row; DatasetError if none can be read."""


FORMATS: Registry[DatasetFormat] = Registry("dataset format")


def dataset_format(name: str):
    """Register the decorated class (instantiated without arguments) as the dataset format `name`."""

    def declare(cls):
        instance = cls()
        instance.name = name
        FORMATS.add(name, instance, origin_of(cls))
        return cls

    return declare


def formats() -> dict[str, DatasetFormat]:
    """Every registered format, by name (the built-ins first)."""
    return FORMATS.items()


def format_of(path: str) -> DatasetFormat:
    """The format of the dataset at `path`: the last-registered one that claims it."""
    known = formats()
    for fmt in reversed(known.values()):
        if fmt.claims(path):
            return fmt
    raise DatasetError(f"no dataset format reads {path}; known formats: {', '.join(known)}")


def load(path: str, max_samples: int | None = None) -> tuple[list[Entry], list[str]]:
    """The entries of the dataset at `path`, read by its format (format_of)."""
    return format_of(path).load(path, max_samples)
