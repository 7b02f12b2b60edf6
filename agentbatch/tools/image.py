"""The image_gen toolset: image_generate through an OpenAI-compatible images API (POST /images/generations).

The model is --image_model or IMAGE_MODEL (the tool is offered only when one is set), at --image_base_url
(default --base_url) with IMAGE_API_KEY, else the run's key if that is --base_url's origin, else no key
(ToolSettings.image_endpoint: a key goes only where it belongs); the call goes through the
run's model client, retried like every model call. IMAGE_RESPONSE_FORMAT (url or b64_json; not sent by
default, gpt-image models reject it) and IMAGE_SIZE shape the request. A reply carrying a URL is returned
as is; one carrying base64 bytes is saved into the sample's sandbox under images/ and its path returned.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Annotated

from agentbatch.model.base import ModelCallError
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool
from agentbatch.tools.settings import ToolSettings
from agentbatch.tools.vision import image_mime

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


@tool(unavailable=lambda settings: unavailable(settings))
def image_generate(
    ctx: ToolContext,
    prompt: Annotated[str, "A detailed description of the image."],
    size: Annotated[str | None, "Optional size such as 1024x1024."] = None,
) -> dict:
    """Generate an image from a text description. Returns the image URL, or the path of the saved image
    file in your working directory."""
    if not prompt.strip():
        return _failed("prompt must be a non-empty string")
    settings = ctx.settings
    model = settings.image_model
    if not model:
        return _failed(unavailable(settings))
    request: dict = {"model": model, "prompt": prompt.strip(), "n": 1}
    if size or settings.image_size:
        request["size"] = size or settings.image_size
    if settings.image_response_format:
        request["response_format"] = settings.image_response_format
    try:
        reply = ctx.generate_image(request)
    except ModelCallError as e:
        return _failed(f"image model {model}: {e}")
    item = reply["data"][0] if isinstance(reply.get("data"), list) and reply["data"] else None
    if not isinstance(item, dict):
        return _failed(f"image model {model} returned no image")
    revised = item.get("revised_prompt")
    if item.get("url"):
        return {"image_url": item["url"], "path": None, "revised_prompt": revised, "error": None}
    if not isinstance(item.get("b64_json"), str) or not item["b64_json"]:
        return _failed(f"image model {model} returned neither a URL nor image bytes")
    try:
        data = base64.b64decode(item["b64_json"], validate=True)
    except (binascii.Error, ValueError):
        return _failed(f"image model {model} returned invalid base64")
    path = _save(ctx, data)
    return {"image_url": None, "path": path, "revised_prompt": revised, "error": None}


def _save(ctx: ToolContext, data: bytes) -> str:
    """Write image bytes under images/ in the sandbox; the suffix keeps samples sharing a cwd apart."""
    count = ctx.resources.get("images_saved", 0) + 1
    ctx.resources["images_saved"] = count
    ext = _EXTENSIONS.get(image_mime(data) or "", "png")
    path = f"images/image_{count}_{uuid.uuid4().hex[:6]}.{ext}"
    ctx.sandbox().write_file(path, data)
    return path


def _failed(message: str | None) -> dict:
    return {"image_url": None, "path": None, "error": message}


def unavailable(settings: ToolSettings) -> str | None:
    """Why image_generate cannot be offered: no image model configured."""
    if settings.image_model:
        return None
    return "no image model configured: set --image_model (and --image_base_url if another endpoint serves images)"
