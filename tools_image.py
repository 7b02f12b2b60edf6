"""The image_gen toolset: image_generate through an OpenAI-compatible images API (POST /images/generations).

The model is --image_model (the tool is offered only when it is set), at --image_base_url (default
--base_url). A reply carrying a URL is returned as is; one carrying base64 bytes is saved into the prompt's
sandbox under images/ and its path returned.

Environment:
    IMAGE_API_KEY          key for the images endpoint when it differs from --api_key's provider
    IMAGE_RESPONSE_FORMAT  url or b64_json, sent as response_format (default: not sent; gpt-image models
                           always answer with b64_json and reject the parameter)
    IMAGE_SIZE             default size, e.g. 1024x1024 (default: the model's own)
"""

from __future__ import annotations

import base64
import binascii
import os
import uuid

from secrets_guard import getenv
from tool_registry import Tool, ToolContext, ToolSettings, register
from tools_vision import image_mime

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}


def image_generate(args: dict, ctx: ToolContext) -> dict:
    import openai  # imported here: ~0.5 s at start-up, and most runs never call this tool

    prompt = args.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return _failed("prompt must be a non-empty string")
    settings = ctx.settings
    model = settings.image_model
    if not model:
        return _failed(unavailable(settings))
    request: dict = {"model": model, "prompt": prompt.strip(), "n": 1}
    size = args.get("size") or os.environ.get("IMAGE_SIZE")
    if size:
        request["size"] = str(size)
    if os.environ.get("IMAGE_RESPONSE_FORMAT"):
        request["response_format"] = os.environ["IMAGE_RESPONSE_FORMAT"]
    base_url = settings.image_base_url or settings.base_url
    api_key = getenv("IMAGE_API_KEY") or settings.api_key or "none"
    try:
        with openai.OpenAI(base_url=base_url, api_key=api_key, timeout=settings.request_timeout) as client:
            reply = client.images.generate(**request)
    except openai.APIError as e:
        return _failed(f"image model {model}: {type(e).__name__}: {e}")
    usage = getattr(reply, "usage", None)
    if usage is not None:  # the images API counts input/output tokens
        ctx.usage.add(
            {
                "prompt_tokens": getattr(usage, "input_tokens", 0) or 0,
                "completion_tokens": getattr(usage, "output_tokens", 0) or 0,
                "total_tokens": getattr(usage, "total_tokens", 0) or 0,
            }
        )
    if not reply.data:
        return _failed(f"image model {model} returned no image")
    item = reply.data[0]
    revised = getattr(item, "revised_prompt", None)
    if item.url:
        return {"image_url": item.url, "path": None, "revised_prompt": revised, "error": None}
    if not item.b64_json:
        return _failed(f"image model {model} returned neither a URL nor image bytes")
    try:
        data = base64.b64decode(item.b64_json, validate=True)
    except (binascii.Error, ValueError):
        return _failed(f"image model {model} returned invalid base64")
    path = _save(ctx, data)
    return {"image_url": None, "path": path, "revised_prompt": revised, "error": None}


def _save(ctx: ToolContext, data: bytes) -> str:
    """Write image bytes under images/ in the sandbox; the suffix keeps prompts sharing a cwd apart."""
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


IMAGE_GENERATE = register(
    Tool(
        name="image_generate",
        description=(
            "Generate an image from a text description. Returns the image URL, or the path of the saved image "
            "file in your working directory."
        ),
        parameters={
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "A detailed description of the image."},
                "size": {"type": "string", "description": "Optional size such as 1024x1024."},
            },
            "required": ["prompt"],
        },
        handler=image_generate,
        unavailable=unavailable,
    )
)
