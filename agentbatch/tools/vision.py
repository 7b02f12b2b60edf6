"""The vision toolset: vision_analyze asks a vision-capable model a question about one image.

The image is an http(s) URL, a data: URL, or the path of a file in the sample's sandbox (sent as a base64
data URL). It goes to --vision_model (default --model) as an OpenAI `image_url` content part through the
run's model client, so the call is retried and its usage counted like the agent's own. http(s) URLs pass
the private-address policy (url_policy.py) first: a self-hosted endpoint would fetch them from inside our
network.
"""

from __future__ import annotations

import base64
import re
from typing import Annotated

from agentbatch.model.base import ModelCallError
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool
from agentbatch.tools.url_policy import check_url

DEFAULT_QUESTION = "Describe this image in detail."
_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,", re.I)
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


@tool()
def vision_analyze(
    ctx: ToolContext,
    image_url: Annotated[str, "Image URL or file path."],
    question: Annotated[str, "What to find out about the image."],
) -> dict:
    """Look at an image and answer a question about it. The image can be an http(s) URL, a data: URL,
    or the path of an image file in your working directory (PNG, JPEG, GIF or WebP)."""
    if not image_url.strip():
        return {"analysis": "", "error": "image_url must be a URL, a data: URL or a file path"}
    try:
        url = image_url_for_model(image_url.strip(), ctx)
    except (ValueError, OSError) as e:
        return {"analysis": "", "error": str(e)}
    model = vision_model(ctx)
    content = [
        {"type": "text", "text": question.strip() or DEFAULT_QUESTION},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    try:
        text = ctx.ask([{"role": "user", "content": content}], model)
    except ModelCallError as e:
        return {"analysis": "", "error": f"vision model {model}: {e}"}
    if not text:
        return {"analysis": "", "error": f"vision model {model} returned no text"}
    return {"analysis": text, "error": None}


def vision_model(ctx: ToolContext) -> str:
    return ctx.settings.vision_model or ctx.client.settings.model


def image_url_for_model(image: str, ctx: ToolContext) -> str:
    """The URL to put in the image part: http(s) URLs once checked, data: URLs as given, files as data URLs."""
    lowered = image.lower()
    if lowered.startswith("data:"):
        if not _DATA_URL.match(image):
            raise ValueError("a data URL must look like data:image/<type>;base64,<data>")
        return image
    if lowered.startswith(("http://", "https://")):
        check_url(image, ctx.settings.private_networks)
        return image
    if "://" in image and not lowered.startswith("file://"):
        raise ValueError(f"unsupported image URL {image[:80]!r}: use http(s), data: or a file path")
    path = image[len("file://") :] if lowered.startswith("file://") else image
    limit = ctx.settings.vision_max_image_bytes
    try:
        data = ctx.sandbox().read_file(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read image file {path!r}: {e}") from None
    if len(data) > limit:
        raise ValueError(f"image file {path!r} is {len(data)} bytes, over the {limit}-byte limit")
    mime = image_mime(data)
    if mime is None:
        raise ValueError(f"{path!r} is not a PNG, JPEG, GIF or WebP image")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def image_mime(data: bytes) -> str | None:
    """The MIME type of image bytes, told from their signature."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
