"""The vision toolset: vision_analyze asks a vision-capable model a question about one image.

The image is an http(s) URL, a data: URL, or the path of a file in the prompt's sandbox (sent as a base64
data URL). It goes to the model as an OpenAI `image_url` content part, through --base_url with --api_key,
to --vision_model (default --model); the reply's token usage counts into the prompt's usage.
http(s) URLs pass the private-address policy (url_policy.py) first: a self-hosted endpoint would fetch
them from inside our network.

Environment:
    VISION_MAX_IMAGE_BYTES  largest sandbox image file sent (default 20000000)
    BATCH_RUNNER_ALLOW_PRIVATE_URLS  see url_policy.py
"""

from __future__ import annotations

import base64
import os
import re

from tool_registry import Tool, ToolContext, register
from url_policy import check_url

DEFAULT_QUESTION = "Describe this image in detail."
_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,", re.I)
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def vision_analyze(args: dict, ctx: ToolContext) -> dict:
    import openai  # imported here: ~0.5 s at start-up, and most runs never call this tool

    image = args.get("image_url")
    question = args.get("question") or DEFAULT_QUESTION
    if not isinstance(image, str) or not image.strip():
        return {"analysis": "", "error": "image_url must be a URL, a data: URL or a file path"}
    if not isinstance(question, str):
        return {"analysis": "", "error": "question must be a string"}
    try:
        url = image_url_for_model(image.strip(), ctx)
    except (ValueError, OSError) as e:
        return {"analysis": "", "error": str(e)}
    settings = ctx.settings
    model = settings.vision_model or settings.model
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]
    try:
        with openai.OpenAI(
            base_url=settings.base_url, api_key=settings.api_key or "none", timeout=settings.request_timeout
        ) as c:
            reply = c.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
    except openai.APIError as e:
        return {"analysis": "", "error": f"vision model {model}: {type(e).__name__}: {e}"}
    ctx.usage.add(reply.usage)
    text = reply.choices[0].message.content if reply.choices else None
    if not text or not text.strip():
        return {"analysis": "", "error": f"vision model {model} returned no text"}
    return {"analysis": text.strip(), "error": None}


def image_url_for_model(image: str, ctx: ToolContext) -> str:
    """The URL to put in the image part: http(s) URLs once checked, data: URLs as given, files as data URLs."""
    lowered = image.lower()
    if lowered.startswith("data:"):
        if not _DATA_URL.match(image):
            raise ValueError("a data URL must look like data:image/<type>;base64,<data>")
        return image
    if lowered.startswith(("http://", "https://")):
        check_url(image, ctx.settings.allow_private_urls)
        return image
    if "://" in image and not lowered.startswith("file://"):
        raise ValueError(f"unsupported image URL {image[:80]!r}: use http(s), data: or a file path")
    path = image[len("file://") :] if lowered.startswith("file://") else image
    limit = int(os.environ.get("VISION_MAX_IMAGE_BYTES") or 20_000_000)
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


VISION_ANALYZE = register(
    Tool(
        name="vision_analyze",
        description=(
            "Look at an image and answer a question about it. The image can be an http(s) URL, a data: URL, "
            "or the path of an image file in your working directory (PNG, JPEG, GIF or WebP)."
        ),
        parameters={
            "type": "object",
            "properties": {
                "image_url": {"type": "string", "description": "Image URL or file path."},
                "question": {"type": "string", "description": "What to find out about the image."},
            },
            "required": ["image_url", "question"],
        },
        handler=vision_analyze,
    )
)
