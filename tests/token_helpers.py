"""Shared by the --token_ids tests: the requests of one sample, the ids the scripted server sampled, a Hugging
Face tokenizer of its toy ChatML, and the TRL rollout_func exactly as docs/rollouts.md shows it."""

from __future__ import annotations

import re

from cli_helpers import ROOT
from scripted_replies import build_message, completion_ids


def calls_of(bodies: list[dict], prompt: str) -> list[dict]:
    """The requests of one prompt's sample, in call order (each call has one assistant turn more)."""
    mine = [b for b in bodies if b["messages"][0]["content"] == prompt]
    return sorted(mine, key=lambda b: sum(m["role"] == "assistant" for m in b["messages"]))


def sampled(script: list[dict]) -> list[list[int]]:
    """The completion ids the scripted server sends for each reply of a script."""
    return [completion_ids(build_message(spec, turn)[0]) for turn, spec in enumerate(script)]


TOY_CHARS = 0x250  # the toy tokenizer knows the code points below this; its largest id is 3 + TOY_CHARS - 1


def toy_tokenizer(folder) -> str:
    """A Hugging Face tokenizer directory of the scripted server's toy ChatML (one id per character)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2} | {chr(c): 3 + c for c in range(1, TOY_CHARS)}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", eos_token="<|im_end|>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
        "{% for c in m.get('tool_calls') or [] %}<tool_call>{\"name\": \"{{ c['function']['name'] }}\", "
        "\"arguments\": {{ c['function']['arguments'] | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok.save_pretrained(str(folder))
    return str(folder)


def docs_rollout_func():
    """`rollout_func_from` as docs/rollouts.md writes it, run as written (its code block, up to the usage line)."""
    text = (ROOT / "docs" / "rollouts.md").read_text(encoding="utf-8")
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def rollout_func_from" in b]
    space: dict = {}
    exec(code.split("# GRPOTrainer")[0], space)
    return space["rollout_func_from"]
