"""The built-in JSONL dataset format (README, "The dataset"): valid rows kept, every bad line reported by number
and reason."""

from __future__ import annotations

import json
import re

from agentbatch.dataset import DatasetError, Entry
from agentbatch.dataset_formats import dataset_format

MAX_PROMPT_CHARS = 1_000_000
# A docker reference: [registry[:port]/]name[/name...][:tag][@digest], lower-case names. As in docker, a first
# component is a registry only with a dot, a port or "localhost" (so "UPPER/name" is a bad name, not a host).
_IMAGE_RE = re.compile(
    r"^(?:(?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+(?::[0-9]+)?|[a-zA-Z0-9-]+:[0-9]+|localhost)/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


@dataset_format("jsonl")
class JsonlFormat:
    """One JSON object per line with a string "prompt"; claims any path no other format claims."""

    def claims(self, path: str) -> bool:
        return True

    def load(self, path: str, max_samples: int | None) -> tuple[list[Entry], list[str]]:
        return load_entries(path, max_samples)


def load_entries(path: str, max_samples: int | None = None) -> tuple[list[Entry], list[str]]:
    """Valid entries (the first max_samples of them) and one warning per skipped line."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DatasetError(f"dataset file {path} does not exist; pass --dataset_file=PATH to a JSONL file") from None
    except OSError as e:
        raise DatasetError(f"cannot read dataset file {path}: {e.strerror}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    entries: list[Entry] = []
    warnings: list[str] = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if max_samples is not None and len(entries) >= max_samples:
            break
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        entry, problem = _parse(line, number)
        if problem:
            warnings.append(f"{path}:{number}: skipped: {problem}")
        else:
            entries.append(entry)
    return entries, warnings


def _parse(line: bytes, number: int) -> tuple[Entry | None, str | None]:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8 (byte {e.start})"
    try:
        row = json.loads(text)
    except ValueError as e:
        return None, f"not valid JSON ({e.msg} at column {e.colno})"
    except RecursionError:  # e.g. a line of 100,000 "[": json recurses once per level
        return None, "not valid JSON (nested too deeply)"
    return entry_of(row, number)


def entry_of(row: object, number: int) -> tuple[Entry | None, str | None]:
    """A row (a line's JSON, or a Python caller's dict) as an Entry, or why it is not a valid one."""
    if not isinstance(row, dict):
        return None, f"a JSON {_json_type(row)}, not an object"
    if "prompt" not in row:
        return None, 'no "prompt" field'
    prompt = row["prompt"]
    if not isinstance(prompt, str):
        return None, f'"prompt" is a JSON {_json_type(prompt)}, not a string'
    if not prompt.strip():
        return None, '"prompt" is empty'
    if "\x00" in prompt:
        return None, '"prompt" contains a NUL character'
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # a "\ud800" escape decodes to half a character no file or request can hold
        return None, f'"prompt" is not valid Unicode (lone surrogate at character {e.start})'
    if len(prompt) > MAX_PROMPT_CHARS:
        return None, f'"prompt" is {len(prompt)} characters, over the limit of {MAX_PROMPT_CHARS}'
    image = row.get("image") or row.get("docker_image")
    if image is not None and (not isinstance(image, str) or not _IMAGE_RE.match(image)):
        return None, f"image {image!r} is not a valid container image name"
    cwd = row.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
        return None, f"cwd {cwd!r} is not an absolute path"
    for name in ("setup", "verify"):
        if row.get(name) is not None and not _usable_text(row[name]):
            return None, f'"{name}" must be a non-empty shell command (a string)'
    answer = row.get("answer")
    answers = tuple(answer) if isinstance(answer, list) else (answer,) if answer is not None else ()
    if answer is not None and not (answers and all(_usable_text(a) for a in answers)):
        return None, '"answer" must be a non-empty string or a list of them'
    return Entry(number, prompt, image, cwd, row.get("setup"), row.get("verify"), answers), None


def _usable_text(value) -> bool:
    """A non-empty string a command line or a comparison can hold (no NUL, no lone surrogate)."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_type(value) -> str:
    """The JSON name of a parsed value, as the user wrote it (not Python's: "NoneType", "list")."""
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
