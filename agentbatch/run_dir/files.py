"""Writing a run directory: one flushed line per finished sample, and atomic replaces of its JSON files.

The parent process is the only writer (the session's lock keeps a second session out). Lines this session
appends and its caller accounts for are remembered, so the merge copies them without reading them back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

from agentbatch.run_dir import atomic
from agentbatch.run_dir.paths import DISCARDED, FAILED, RunPaths
from agentbatch.run_dir.reader import RunReader
from agentbatch.run_dir.record_shape import why_skipped
from agentbatch.secrets_guard import Redactor
from agentbatch.surrogates import scrub
from agentbatch.tool_set import ToolSet
from trajectory import VALUE_KINDS, shown_kinds


class RunFiles:
    """The run directory as its session writes it."""

    def __init__(self, run_dir: str, secrets: tuple[str, ...] = ()):
        self.paths = RunPaths(run_dir)
        self.dir = self.paths.dir
        self.redact = Redactor(secrets)
        self._handles: dict[str, object] = {}
        # Path → offset → length of the lines this session appended and its caller
        # accounted for: the merge copies them as they are instead of reading each back (see append).
        self.accounted: dict[str, dict[int, int]] = {}
        # Path → VALUE_KINDS → offset of the first accounted line there showing it: what the merge's search
        # for lead entries would find in a file this session wrote alone, known without reading it.
        self.kind_lines: dict[str, dict[str, int]] = {}
        self.use_tools(ToolSet())

    def use_tools(self, tools: ToolSet) -> None:
        """The run's tools (tools.json): every line gets their entries; a line calling another is not kept."""
        self.tool_set = tools
        self.tool_names, self.known_tools = tools.names, frozenset(tools.names)

    def reader(self, redacted: bool = False) -> RunReader:
        """The run as this session reads it back, with its tools; `redacted`: of its secrets too, for lines it copies
        into an output (the merge). The resume scan, the budget and the statistics need not be: what they write
        goes through write_json's redaction, and a line costs ~10 µs more to search for the secrets (10 KB)."""
        return RunReader(self.dir, self.redact if redacted else (), self.tool_set)

    def prepare(self) -> None:
        """Create the directory and cut torn last lines a kill left in the files we append to."""
        os.makedirs(self.dir, exist_ok=True)
        for name in (FAILED, DISCARDED):
            _cut_torn_tail(self.paths.path(name))

    def append(self, path: str, obj: dict, kept: bool = False) -> bool:
        """Write one line and flush it, so a kill never loses a finished sample.

        With `kept` (a trajectory for a batch file), returns True when the line is `obj` exactly as the merge
        would read it back and keep it: the caller then counts it in the merge's statistics itself, and the
        merge copies the line without parsing it (a merge of this session's lines was ~0.2 ms a line).
        """
        text = _dumps(obj)
        written = self.line_text(text)
        line = written + "\n"
        f = self._handles.get(path)
        if f is None:
            f = self._handles[path] = open(path, "a", encoding="utf-8")
        size = os.fstat(f.fileno()).st_size
        try:
            f.write(line)
            f.flush()
        except OSError:
            # Disk full or gone: cut the half-written line, so every line in the file stays whole.
            del self._handles[path]
            with contextlib.suppress(OSError):
                f.close()
            with contextlib.suppress(OSError):
                os.truncate(path, size)
            raise
        # A redacted line, one with a lone surrogate (written as U+FFFD), or one the merge filters is read back
        # like any other.
        if not kept or written is not text or why_skipped("trajectory", obj, self.known_tools) is not None:
            return False
        length = os.fstat(f.fileno()).st_size - size
        self.accounted.setdefault(path, {})[size] = length
        firsts = self.kind_lines.setdefault(path, {})
        if len(firsts) < len(VALUE_KINDS):
            for kind in shown_kinds(obj).difference(firsts):
                firsts[kind] = size
        return True

    def line_text(self, text: str) -> str:
        """A line's JSON text as it is written: no secret, whatever a tool or endpoint echoed, and no lone
        surrogate, which UTF-8 cannot hold and whose JSON escape would make the whole file unloadable in `datasets`."""
        return scrub(self.redact(text))

    def replace_lines(self, path: str, changed: dict[int, dict]) -> int:
        """Replace a file of lines whole (run_dir/atomic.py), its lines numbered in `changed` (1-based, among the
        lines that are not blank, as the reader numbers them) by those records, every other line as it was; how
        many were replaced. A batch file is never appended to: this is how a rescore rewrites one."""
        replaced = 0
        with atomic.replacing(path) as out:
            for number, (_offset, raw, _value) in enumerate(self.reader().read(path, parse=None), 1):
                record = changed.get(number)
                if record is None:
                    out.write(raw)
                    continue
                out.write((self.line_text(_dumps(record)) + "\n").encode("utf-8"))
                replaced += 1
        return replaced

    def sync(self) -> None:
        """fsync the open files (done at checkpoints, so power loss costs seconds, not hours)."""
        for f in self._handles.values():
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self._handles.values():
            f.close()
        self._handles.clear()

    def keep_state(self, state: str | bytes, name: str) -> None:
        """Record a sample's kept final state as final_state/<name>: a file a worker staged outside the run directory
        (moved in, the staged file gone), or its bytes. Whole or not at all: its line, which names it, comes after."""
        os.makedirs(self.paths.final_state(), exist_ok=True)
        target = self.paths.final_state(name)
        if isinstance(state, bytes):
            with atomic.replacing(target) as f:
                f.write(state)
            return
        try:
            os.replace(state, target)  # the staging directory on the run's file system
        except OSError:
            with open(state, "rb") as src, atomic.replacing(target) as f:
                shutil.copyfileobj(src, f, 1 << 20)
            os.unlink(state)

    def write_json(self, name: str, obj: dict) -> None:
        """Replace a JSON file of the run atomically, redacted and without lone surrogates as every line."""
        text = scrub(self.redact(json.dumps(obj, indent=2, ensure_ascii=False)))
        atomic.write_text(self.paths.path(name), text + "\n")


def _dumps(obj: dict) -> str:
    """json.dumps(obj, ensure_ascii=False), with a trailing `tools` text (a trajectory's schemas) escaped once."""
    tools = obj.get("tools")
    if not isinstance(tools, str) or next(reversed(obj)) != "tools":
        return json.dumps(obj, ensure_ascii=False)
    # The schemas are ~80 % of a trajectory line and one of a few texts per run: escaping them again for
    # every line was most of the runner's own time per sample.
    token = _tools_tokens.get(tools)
    if token is None:
        if len(_tools_tokens) >= 256:
            _tools_tokens.clear()
        token = _tools_tokens[tools] = json.dumps(tools, ensure_ascii=False)
    rest = json.dumps({k: v for k, v in obj.items() if k != "tools"}, ensure_ascii=False)
    return f'{rest[:-1]}, "tools": {token}}}' if len(rest) > 2 else f'{{"tools": {token}}}'


_tools_tokens: dict[str, str] = {}


def _cut_torn_tail(path: str) -> None:
    """Drop a last line without its newline (a write cut by a kill), so the next append starts clean."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            pos = size
            while pos > 0:
                step = min(65536, pos)
                f.seek(pos - step)
                chunk = f.read(step)
                i = chunk.rfind(b"\n")
                if i >= 0:
                    f.truncate(pos - step + i + 1)
                    return
                pos -= step
            f.truncate(0)
    except FileNotFoundError:
        pass
