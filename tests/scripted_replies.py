"""Reply building for scripted_server: the prompt a request is keyed on, assistant messages from reply specs,
OpenAI-style error bodies, and a tiny PNG for the image endpoint. Standard library only."""

from __future__ import annotations

import json
import struct
import zlib

MODEL_ID = "scripted-model"
DEFAULT_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
MALFORMED_BODY = b'{"id": "chatcmpl-malformed", "object": "chat.completion", "choices": [{'
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def _make_png() -> bytes:
    """Return a valid 1x1 red RGB PNG."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\xff\x00\x00")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


PNG_BYTES = _make_png()


def _text_of(content) -> str:
    """Flatten message content (str, None or list of parts) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(texts)
    return str(content)


def prompt_of(body: dict) -> str:
    """Return the text of the first user message of a chat request."""
    for msg in body.get("messages") or []:
        if isinstance(msg, dict) and msg.get("role") == "user":
            return _text_of(msg.get("content"))
    return ""


def spec_list(value, what: str) -> list:
    """Normalise a spec or list of specs, rejecting anything else early."""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise TypeError(f"{what} must be a reply spec dict or a list of them")
    return value


def error_body(status: int, message: str, type_: str | None = None, code=None) -> dict:
    """Build an OpenAI-style error object."""
    if type_ is None:
        type_ = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "api_error")
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def build_message(spec: dict, turn: int) -> tuple[dict, str]:
    """Return the assistant message and finish_reason for a reply spec."""
    calls = []
    for i, call in enumerate(spec.get("tool_calls") or []):
        args = call.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        calls.append(
            {
                "id": call.get("id") or f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": args},
            }
        )
    content = spec.get("content", None if calls else "OK")
    msg: dict = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    for key in ("reasoning", "reasoning_content", "reasoning_details"):
        if key in spec:
            msg[key] = spec[key]
    finish = spec.get("finish_reason") or ("tool_calls" if calls else "stop")
    return msg, finish


def build_logprobs(spec: dict, content: str | None) -> tuple[dict | None, list | None]:
    """The choice's `logprobs` and vLLM-style `token_ids` for a request that asked for logprobs.

    spec "logprobs": a list of [token, logprob] pairs, or true for one token per character of the content
    with logprob -0.01 * position; spec "token_ids": a list of ints, or true for 1000 + position.
    """
    wanted = spec.get("logprobs")
    if wanted is True:
        pairs = [[ch, round(-0.01 * i, 4)] for i, ch in enumerate(content or "")]
    elif isinstance(wanted, list):
        pairs = wanted
    else:
        pairs = []
    entries = [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in pairs]
    ids = spec.get("token_ids")
    if ids is True:
        ids = [1000 + i for i in range(len(entries))]
    return ({"content": entries, "refusal": None} if wanted else None), ids


# -- token ids (`return_token_ids`), in a toy ChatML of one id per character ------------------------------

IM_START, IM_END = 1, 2
TOKEN_SHAPES = ("vllm", "sglang", "sglext", "llama-server", "none")


def encode(text: str) -> list[int]:
    """The toy tokenizer: one id per character (3 + its code point); special tokens are 1 and 2."""
    return [3 + ord(ch) for ch in text]


def turn_text(message: dict) -> str:
    """What a message renders as: its content, then each tool call as <tool_call>{name, arguments}</tool_call>."""
    text = _text_of(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        text += "<tool_call>" + json.dumps({"name": function.get("name"), "arguments": function.get("arguments")})
        text += "</tool_call>"
    return text


def render_prompt(messages: list, drift: bool = False) -> list[int]:
    """The prompt's ids: each message as <|im_start|>role\\ntext<|im_end|>\\n, then <|im_start|>assistant\\n.

    `drift`: earlier assistant turns are rendered with a leading space, as a template that normalises the
    history would: the prompt then no longer begins with the earlier calls' prompt + completion.
    """
    ids: list[int] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        text = turn_text(m)
        if drift and m.get("role") == "assistant":
            text = " " + text
        ids += [IM_START, *encode(f"{m.get('role')}\n{text}"), IM_END, *encode("\n")]
    return ids + [IM_START, *encode("assistant\n")]


def completion_ids(message: dict) -> list[int]:
    """The ids the toy model "sampled" for a reply: its text, then <|im_end|>."""
    return [*encode(turn_text(message)), IM_END]


def add_token_ids(reply: dict, body: dict, spec: dict) -> None:
    """Add the ids to a built reply in the spec's `token_shape` (default vLLM's), as that server does.

    With `logprobs: true` in the request, the choice's logprobs have one entry per completion id (-0.01 per
    position, from -0.01), each with the id as llama-server gives it.
    """
    shape = spec.get("token_shape", "vllm")
    if shape not in TOKEN_SHAPES:
        raise ValueError(f"token_shape must be one of {TOKEN_SHAPES}")
    choice = reply["choices"][0]
    prompt = render_prompt(body.get("messages") or [], bool(spec.get("drift")))
    completion = completion_ids(choice["message"])
    if body.get("logprobs") or shape == "llama-server":
        text = [chr(i - 3) if i > IM_END else "<|im_end|>" for i in completion]
        entries = [
            {"id": i, "token": t, "logprob": round(-0.01 * (n + 1), 4), "bytes": list(t.encode()), "top_logprobs": []}
            for n, (i, t) in enumerate(zip(completion, text, strict=True))
        ]
        choice["logprobs"] = {"content": entries, "refusal": None}
    if shape == "vllm":
        reply["prompt_token_ids"], choice["token_ids"] = prompt, completion
    elif shape == "sglang":
        choice["prompt_token_ids"], choice["response_token_ids"] = prompt, completion
    elif shape == "sglext":
        reply["sglext"] = {"input_ids": prompt, "output_ids": [completion]}
