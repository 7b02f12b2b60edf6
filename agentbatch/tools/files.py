"""The file toolset: read, write, patch and search files in the sample's sandbox."""

from __future__ import annotations

import shlex
from typing import Annotated

from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool

MAX_READ_BYTES = 1_000_000
MAX_PATCH_BYTES = 8 * 1024 * 1024  # patch must hold the whole file to edit it
Path = Annotated[str, "File path, relative to the working directory or absolute."]


@tool()
def read_file(ctx: ToolContext, path: Path, offset: int | None = None, limit: int | None = None) -> dict:
    """Read a text file. Optional 1-based line offset and line limit."""
    # Read no more than is shown: a huge file, or /dev/zero reached by a link, costs the cap and no more.
    data = ctx.sandbox().read_file(_nonempty(path), limit=MAX_READ_BYTES)
    text = data.decode("utf-8", "replace")
    lines = text.splitlines(keepends=True)
    first = max(offset or 1, 1)
    chosen = lines[first - 1 : first - 1 + limit] if limit and limit > 0 else lines[first - 1 :]
    return {"content": "".join(chosen), "total_lines": len(lines), "error": None}


@tool()
def write_file(ctx: ToolContext, path: Path, content: str) -> dict:
    """Create or overwrite a file with the given content (parent directories are created)."""
    data = content.encode("utf-8")
    ctx.sandbox().write_file(_nonempty(path), data)
    return {"path": path, "bytes_written": len(data), "error": None}


@tool()
def patch(ctx: ToolContext, path: Path, old_string: str, new_string: str, replace_all: bool | None = None) -> dict:
    """Replace old_string with new_string in a file (old_string must be unique unless replace_all)."""
    if not old_string:
        return {"error": "old_string (non-empty) and new_string must be strings"}
    sandbox = ctx.sandbox()
    data = sandbox.read_file(_nonempty(path), limit=MAX_PATCH_BYTES + 1)
    if len(data) > MAX_PATCH_BYTES:
        return {"error": f"{path} is over {MAX_PATCH_BYTES} bytes: patch edits smaller files; use the terminal"}
    text = data.decode("utf-8")
    count = text.count(old_string)
    if count == 0:
        return {"error": f"old_string not found in {path}"}
    if count > 1 and not replace_all:
        return {"error": f"old_string occurs {count} times in {path}; give more context or set replace_all"}
    text = text.replace(old_string, new_string) if replace_all else text.replace(old_string, new_string, 1)
    sandbox.write_file(path, text.encode("utf-8"))
    return {"path": path, "replacements": count if replace_all else 1, "error": None}


@tool()
def search_files(
    ctx: ToolContext,
    pattern: str,
    path: Annotated[str | None, "Directory to search (default: working directory)."] = None,
    file_glob: Annotated[str | None, "Only files matching this glob, e.g. *.py"] = None,
    max_results: int | None = None,
) -> dict:
    """Search file contents under a directory for an extended regular expression; returns file:line:text matches."""
    if not pattern:
        return {"error": "pattern must be a non-empty string"}
    limit = max_results if max_results and max_results > 0 else 100
    sandbox = ctx.sandbox()
    # Where the file tools may not go, neither may a search (the local sandbox's own directories).
    start = sandbox.confine(path or ".")
    # find + grep work in every image we run (busybox has no grep --include), so one command serves all.
    # find reads any argument that starts with "-" as an option (`-delete`!): the path must not.
    name = f"-name {shlex.quote(file_glob)} " if file_glob else ""
    cmd = (
        f"find {shlex.quote(not_an_option(start))} -type f {name}-exec grep -nHIE -e {shlex.quote(pattern)} {{}} +"
        f" 2>/dev/null | head -n {limit}"
    )
    result = sandbox.exec(cmd, timeout=ctx.limits.cap(ctx.settings.command_timeout))
    matches = [line for line in result.output.splitlines() if line]
    return {"matches": matches, "count": len(matches), "error": None}


def not_an_option(path: str) -> str:
    """A path no command can take for an option: one starting with "-" becomes "./-..."."""
    return "./" + path if path.startswith("-") else path


def _nonempty(path: str) -> str:
    if not path:
        raise ValueError("path must be a non-empty string")
    return path
