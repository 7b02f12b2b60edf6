"""The file toolset: read, write, patch and search files in the prompt's sandbox."""

from __future__ import annotations

import shlex

from tool_registry import Tool, ToolContext, register

MAX_READ_BYTES = 1_000_000


def read_file(args: dict, ctx: ToolContext) -> dict:
    path = _path(args)
    data = ctx.sandbox().read_file(path)
    text = data[:MAX_READ_BYTES].decode("utf-8", "replace")
    lines = text.splitlines(keepends=True)
    offset = max(int(args.get("offset") or 1), 1)
    limit = int(args.get("limit") or 0)
    chosen = lines[offset - 1 : offset - 1 + limit] if limit > 0 else lines[offset - 1 :]
    return {"content": "".join(chosen), "total_lines": len(lines), "error": None}


def write_file(args: dict, ctx: ToolContext) -> dict:
    path = _path(args)
    content = args.get("content")
    if not isinstance(content, str):
        return {"error": "content must be a string"}
    data = content.encode("utf-8")
    ctx.sandbox().write_file(path, data)
    return {"path": path, "bytes_written": len(data), "error": None}


def patch(args: dict, ctx: ToolContext) -> dict:
    path = _path(args)
    old, new = args.get("old_string"), args.get("new_string")
    if not isinstance(old, str) or not old or not isinstance(new, str):
        return {"error": "old_string (non-empty) and new_string must be strings"}
    sandbox = ctx.sandbox()
    text = sandbox.read_file(path).decode("utf-8")
    count = text.count(old)
    if count == 0:
        return {"error": f"old_string not found in {path}"}
    if count > 1 and not args.get("replace_all"):
        return {"error": f"old_string occurs {count} times in {path}; give more context or set replace_all"}
    text = text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1)
    sandbox.write_file(path, text.encode("utf-8"))
    return {"path": path, "replacements": count if args.get("replace_all") else 1, "error": None}


def search_files(args: dict, ctx: ToolContext) -> dict:
    pattern = args.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        return {"error": "pattern must be a non-empty string"}
    path = args.get("path") or "."
    glob = args.get("file_glob")
    limit = int(args.get("max_results") or 100)
    # find + grep work in every image we run (busybox has no grep --include), so one command serves all.
    name = f"-name {shlex.quote(glob)} " if glob else ""
    cmd = (
        f"find {shlex.quote(path)} -type f {name}-exec grep -nHIE -e {shlex.quote(pattern)} {{}} + 2>/dev/null"
        f" | head -n {limit}"
    )
    result = ctx.sandbox().exec(cmd, timeout=ctx.settings.command_timeout)
    matches = [line for line in result.output.splitlines() if line]
    return {"matches": matches, "count": len(matches), "error": None}


def _path(args: dict) -> str:
    path = args.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError("path must be a non-empty string")
    return path


_PATH = {"type": "string", "description": "File path, relative to the working directory or absolute."}

register(
    Tool(
        "read_file",
        "Read a text file. Optional 1-based line offset and line limit.",
        {
            "type": "object",
            "properties": {"path": _PATH, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
        read_file,
    )
)
register(
    Tool(
        "write_file",
        "Create or overwrite a file with the given content (parent directories are created).",
        {
            "type": "object",
            "properties": {"path": _PATH, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
        write_file,
    )
)
register(
    Tool(
        "patch",
        "Replace old_string with new_string in a file (old_string must be unique unless replace_all).",
        {
            "type": "object",
            "properties": {
                "path": _PATH,
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            "required": ["path", "old_string", "new_string"],
        },
        patch,
    )
)
register(
    Tool(
        "search_files",
        "Search file contents under a directory for an extended regular expression; returns file:line:text matches.",
        {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string", "description": "Directory to search (default: working directory)."},
                "file_glob": {"type": "string", "description": "Only files matching this glob, e.g. *.py"},
                "max_results": {"type": "integer"},
            },
            "required": ["pattern"],
        },
        search_files,
    )
)
