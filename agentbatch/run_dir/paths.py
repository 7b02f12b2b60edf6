"""The names of a run directory's files, and where a run's directory is: the only place that spells them
(docs/output.md)."""

from __future__ import annotations

import os
import re
import stat
import uuid

TRAJECTORIES = "trajectories.jsonl"
DISCARDED = "discarded.jsonl"
FAILED = "failed.jsonl"
CHECKPOINT = "checkpoint.json"
STATISTICS = "statistics.json"
TOOLS = "tools.json"  # the run's tool set (tool_set.ToolSet.record): its toolsets and tools, built-in and own
LOCK = "session.lock"
HARBOR_WARNINGS = "harbor_warnings.json"  # the task.toml warnings a session of the run showed (harbor/run.py)
ARTIFACTS = (
    "artifacts"  # artifacts/<prompt index>-<sample index>/: the files a sample's check kept (run_dir/artifacts.py)
)
EXPORT = "export"  # export/<format>/ and export/report.json
EXPORT_REPORT = "report.json"
EXPORT_LOCK = "export.lock"  # in export/: held by the export writing there (run_dir/lock.py)
FINAL_STATE = "final_state"  # final_state/<name>.tar: a sample's sandbox as its agent left it (sample_state.py)
REPORT = "report.html"  # --report (docs/report.md)
COMPARE = "compare.html"  # --compare: the run and others side by side
_BATCH = re.compile(r"^batch_(\d+)\.jsonl$")


def run_path(output_dir: str | os.PathLike, run_name: str) -> str:
    """The directory of the run --run_name names (a plain name, flag_checks.run_name) under --output_dir."""
    return os.path.join(output_dir, run_name)


def named_run(output_dir: str | os.PathLike, name: str) -> str:
    """A run named by --compare: a name under --output_dir, or a run directory's own path."""
    if os.sep in name or name.startswith("."):
        return os.path.expanduser(name)
    return run_path(output_dir, name)


class RunPaths:
    """The paths of one run directory's files."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = os.fspath(run_dir)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def batch(self, n: int) -> str:
        return self.path(f"batch_{n}.jsonl")

    def batch_numbers(self) -> list[int]:
        """The existing batch files' numbers, ascending: regular files only (a directory or a FIFO of that name
        is no batch file, and opening a FIFO would wait forever; `odd_files` names them)."""
        return sorted(n for n, regular in self._batch_names() if regular)

    def next_batch(self) -> int:
        """The number a new session's first batch file gets: past every name of one, regular file or not."""
        return max((n for n, _ in self._batch_names()), default=-1) + 1

    def odd_files(self) -> list[tuple[str, str]]:
        """(name, what it is) of each entry named like one of the run's files that is not a regular file."""
        out = []
        for name in sorted(self._listing()):
            if _BATCH.match(name) or name in _FILES:
                what = _kind(os.path.join(self.dir, name))
                if what is not None:
                    out.append((name, what))
        return out

    def _batch_names(self) -> list[tuple[int, bool]]:
        return [
            (int(m.group(1)), _kind(self.path(name)) is None) for name in self._listing() if (m := _BATCH.match(name))
        ]

    def _listing(self) -> list[str]:
        try:
            return os.listdir(self.dir)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def batches(self) -> list[str]:
        """The existing batch files, in numeric order (the order of trajectories.jsonl)."""
        return [self.batch(n) for n in self.batch_numbers()]

    def holds_run(self) -> bool:
        """Whether a session has written here: a batch file, a discard, a failure or a checkpoint."""
        return bool(self.batch_numbers()) or any(
            os.path.exists(self.path(name)) for name in (DISCARDED, FAILED, CHECKPOINT)
        )

    def final_state(self, name: str = "") -> str:
        """final_state/, or the kept state a line's `final_state` names (a file name: nothing else is taken)."""
        if not name:
            return self.path(FINAL_STATE)
        return os.path.join(self.dir, FINAL_STATE, os.path.basename(name))

    def artifacts(self, prompt_index: int | None = None, sample_index: int = 0) -> str:
        """artifacts/, or one sample's folder in it."""
        if prompt_index is None:
            return self.path(ARTIFACTS)
        return os.path.join(self.dir, ARTIFACTS, f"{int(prompt_index)}-{int(sample_index)}")

    def export(self, name: str = "") -> str:
        """export/, or a format's folder or a file in it."""
        return os.path.join(self.dir, EXPORT, name) if name else os.path.join(self.dir, EXPORT)


_FILES = frozenset((TRAJECTORIES, DISCARDED, FAILED, CHECKPOINT, STATISTICS, TOOLS))


def _kind(path: str) -> str | None:
    """None for a regular file (or a symlink to one), else what the entry is, in words."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a dangling symbolic link" if os.path.islink(path) else None  # gone meanwhile: nothing to say
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def final_state_name(index: int, sample: int) -> str:
    """The file a sample's kept state gets in final_state/: its prompt and sample, and a part no other has."""
    return f"{index}-{sample}-{uuid.uuid4().hex[:12]}.tar"
