"""The embedded model's exact token ids (--token_ids with --model=local), in the server child: what llama.cpp's
`generate` saw and sampled for a request, added to its reply in vLLM's shape when the request asks for them.

llama-cpp-python's app builds its reply through a response model that drops unknown fields, so the ids go
beside it (SAMPLED, by reply id) and the RequestAdapter's `send` (adding_ids) puts them in the body it sends.
"""

from __future__ import annotations

import json

# Reply id → the ids SampledIds found for it, until RequestAdapter puts them in the reply it sends. Requests are
# served one at a time, so a few entries cover every reply still being sent.
SAMPLED: dict[str, dict] = {}
SAMPLED_KEPT = 8


def with_sampled_ids(raw: bytes, wanted: bool = True) -> bytes:
    """A chat reply's body with the ids its request sampled (SampledIds), in vLLM's shape, if `wanted`; else as
    it was. The ids found for it are forgotten either way."""
    try:
        reply = json.loads(raw)
    except ValueError:
        return raw
    found = SAMPLED.pop(str(reply.get("id")), None) if isinstance(reply, dict) else None
    if found is None or not wanted or not reply.get("choices"):
        return raw
    reply["prompt_token_ids"] = found["prompt_token_ids"]
    reply["choices"][0]["token_ids"] = found["token_ids"]
    if "logprobs" in found:
        reply["choices"][0]["logprobs"] = found["logprobs"]
    return json.dumps(reply).encode()


class SampledIds:
    """The exact ids of one request: `Llama.generate` wrapped, which sees every prompt and every sampled id.

    llama-cpp-python's server returns no ids, and its logprobs carry token texts only; but every completion
    runs through `generate`, which yields each id it samples, the end of turn included (llama.cpp drops that
    one from the text, the usage and the logprobs). A request that ran one completion (a plain chat, or
    `tool_choice: "none"`) gets vLLM's `prompt_token_ids` and `choices[0].token_ids`, and with logprobs one
    entry per id computed from the logits (raw, before temperature, as vLLM's). A request that ran several
    (chatml-function-calling's tool path: the choice of a tool, its arguments, "another call?", joined by text
    the handler inserts and re-tokenized between them) gets none: no one sequence of ids is what was sampled.
    Requests are serialized on the one Llama, so a recorder per request is unambiguous.
    """

    def __init__(self, llama):
        self.llama = llama
        self.calls: list[tuple[list[int], list[int]]] = []

    def __enter__(self) -> SampledIds:
        generate = self.llama.generate

        def recorded(tokens, *args, **kwargs):
            prompt, ids = [int(t) for t in tokens], []
            self.calls.append((prompt, ids))
            for token in generate(tokens, *args, **kwargs):
                ids.append(int(token))
                yield token

        self.llama.generate = recorded  # an instance attribute shadows the method, for this request only
        return self

    def __exit__(self, *exc) -> None:
        del self.llama.generate

    def add_to(self, reply, logprobs: bool):
        """The reply, its ids kept for RequestAdapter to add (the app's response model drops unknown fields)."""
        if not isinstance(reply, dict) or len(self.calls) != 1 or not reply.get("choices"):
            return reply
        prompt, ids = self.calls[0]
        found: dict = {"prompt_token_ids": prompt, "token_ids": ids}
        if logprobs and getattr(self.llama, "_logits_all", False):  # the server's default; else no logits rows
            found["logprobs"] = {"content": self._logprobs(prompt, ids), "refusal": None}
        SAMPLED[str(reply.get("id"))] = found
        while len(SAMPLED) > SAMPLED_KEPT:  # replies sent without them (not asked) are never popped
            del SAMPLED[next(iter(SAMPLED))]
        return reply

    def _logprobs(self, prompt: list[int], ids: list[int]) -> list[dict]:
        """One entry per sampled id: its logprob from the logits row that sampled it (logits_all, the default)."""
        from llama_cpp import Llama

        entries = []
        for i, token in enumerate(ids):
            row = self.llama.scores[len(prompt) - 1 + i]
            piece = self.llama.detokenize([token], special=True)
            text = piece.decode("utf-8", errors="replace")
            value = float(Llama.logits_to_logprobs(row)[token])
            entries.append({"id": token, "token": text, "logprob": value, "bytes": list(piece), "top_logprobs": []})
        return entries


def asks_ids(raw: bytes) -> bool:
    """Whether a chat request asks for its token ids (vLLM's `return_token_ids`, which --token_ids sends)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("return_token_ids") is True


def adding_ids(send, wanted: bool):
    """The ASGI `send` of a chat reply: its body held to the end, then sent with its sampled ids (with_sampled_ids)
    when the request asked for them; without, `send` itself (a stream streams, the reply is llama.cpp's own)."""
    if not wanted:
        return send
    start: dict = {}
    body: list[bytes] = []

    async def sending(message):
        if message["type"] == "http.response.start":
            start.update(message)
            return None
        if message["type"] != "http.response.body" or not start:
            return await send(message)
        body.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        raw = b"".join(body)
        raw = with_sampled_ids(raw, start.get("status") == 200)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        await send(dict(start, headers=[*headers, (b"content-length", str(len(raw)).encode())]))
        return await send({"type": "http.response.body", "body": raw, "more_body": False})

    return sending
