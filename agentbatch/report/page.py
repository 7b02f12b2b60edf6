"""The report's one HTML file: styles and the page's script inlined (package data files), the figures and the
index as JSON, the trajectories' chunks as gzip in base64, a Content-Security-Policy that lets only this page's
own script run and nothing reach the network."""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources
from typing import BinaryIO

# Concatenated in this order into one script (one scope): helpers first, the start-up last.
SCRIPTS = ("core.js", "charts.js", "views.js", "outcomes.js", "browser.js", "trajectory.js", "compare.js", "main.js")
STYLES = ("report.css",)
CHUNK_TYPE = "application/x-gzip-base64"


def asset(name: str) -> str:
    return resources.files("agentbatch.report").joinpath("assets", name).read_text(encoding="utf-8")


def script_text() -> str:
    body = "\n".join(f"// ---- {name}\n{asset(name)}" for name in SCRIPTS)
    if "</script" in body.lower() or "<!--" in body:
        raise ValueError("the report's script must not hold </script or <!--: it would end its element early")
    return f'(function () {{\n"use strict";\n{body}\n}})();\n'


def _json(value) -> str:
    """JSON text; a NaN or infinity (which a hand-edited line can hold and JSON cannot) is written as null."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        text = json.dumps(value, ensure_ascii=False)
        return json.dumps(json.loads(text, parse_constant=lambda _: None), ensure_ascii=False, allow_nan=False)


def json_for_script(value) -> str:
    """JSON that cannot end its <script> element: every "<" is written as its escape."""
    return _json(value).replace("<", "\\u003c")


def chunk_element(number: int, text: str) -> bytes:
    return f'<script type="{CHUNK_TYPE}" id="c{number}">{text}</script>\n'.encode("ascii")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii")


def write_page(out: BinaryIO, title: str, data: dict, index: dict, chunks: BinaryIO) -> None:
    """The whole page: what the first paint needs first, the chunks (read when a trajectory opens) last."""
    script = script_text()
    style = "\n".join(asset(name) for name in STYLES)
    policy = (
        f"default-src 'none'; script-src '{_sha256(script)}'; style-src '{_sha256(style)}'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
    head = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
        '<div id="app"><p class="loading">Loading the report…</p>'
        "<noscript>This report is drawn by its own script: allow JavaScript for this file.</noscript></div>\n"
        f'<script type="application/json" id="report-data">{json_for_script(data)}</script>\n'
        f'<script type="application/json" id="report-index">{json_for_script(index)}</script>\n'
        f"<script>{script}</script>\n"
    )
    out.write(head.encode("utf-8"))
    chunks.seek(0)
    while block := chunks.read(1 << 20):
        out.write(block)
    out.write(b"</body>\n</html>\n")
