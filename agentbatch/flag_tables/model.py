"""The model, its endpoint, and what every call of it asks for or is sent.

The `model` group of the settings (settings.ModelFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

import agentbatch.flag_checks as check
from agentbatch.flag_type import Flag, integer, optional, text_flag

FLAGS: tuple[Flag, ...] = (
    text_flag(
        "model",
        "anthropic/claude-sonnet-4.6",
        "model name at the endpoint; `local` runs the embedded model offline",
        group="model",
    ),
    text_flag(
        "base_url", "https://openrouter.ai/api/v1", "any OpenAI-compatible endpoint", check.base_url, group="model"
    ),
    text_flag(
        "api_key",
        None,
        "else OPENROUTER_API_KEY, else OPENAI_API_KEY; required for openrouter.ai and api.openai.com",
        lambda n, v: check.header_safe(f"--{n}", v),
        shown="env",
        group="model",
    ),
    Flag(
        "max_tokens",
        None,
        "most tokens a model may write per call (the request's `max_tokens`)",
        optional(integer(1)),
        kind=int,
        group="model",
    ),
    Flag(
        "providers_allowed",
        None,
        "OpenRouter `provider.only`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    Flag(
        "providers_ignored",
        None,
        "OpenRouter `provider.ignore`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    Flag(
        "providers_order",
        None,
        "OpenRouter `provider.order`, comma-separated",
        check.name_list,
        kind=str,
        group="model",
    ),
    text_flag(
        "provider_sort",
        None,
        "OpenRouter `provider.sort`: price, throughput or latency",
        check.provider_sort,
        group="model",
    ),
    text_flag(
        "reasoning_effort",
        None,
        "none, minimal, low, medium, high, xhigh, max or ultra: sends `reasoning: {enabled: true, effort}`",
        check.reasoning_effort,
        group="model",
    ),
    Flag(
        "reasoning_disabled",
        False,
        'ask the model not to reason: sends `reasoning: {effort: "none"}`',
        check.boolean,
        group="model",
    ),
    text_flag("ephemeral_system_prompt", None, "system prompt sent with every call, never saved", group="model"),
    text_flag(
        "prefill_messages_file",
        None,
        "JSON array of {role, content} sent before every prompt, never saved",
        check.prefill_messages,
        group="model",
        field="prefill_messages",
    ),
    Flag(
        "logprobs",
        False,
        "ask for token log probabilities and store them with each assistant turn",
        check.boolean,
        group="model",
    ),
    Flag(
        "token_ids",
        False,
        "ask every model call for the token ids it saw and sampled and record the sample's `tokens` "
        "(ids, mask, logprobs: docs/output.md); where the endpoint sends none they are retokenized",
        check.boolean,
        group="model",
    ),
    text_flag(
        "tokenizer",
        None,
        "with --token_ids, the Hugging Face tokenizer (name or directory) whose chat template retokenizes the calls "
        "of an endpoint that sends no ids",
        shown="the model's name",
        group="model",
    ),
    text_flag(
        "policy_version",
        None,
        "a label of the policy the model serves, recorded on every sample (its line's `policy_version`) and on "
        "every model call of its `tokens` (docs/rollouts.md)",
        check.label,
        group="model",
    ),
    Flag(
        "cache",
        False,
        "answer a model call from the model-call cache when the same request was made before, and store every "
        "reply; a cached call costs nothing and counts in `usage.cached_calls` (see docs/replay.md)",
        check.boolean,
        group="model",
    ),
    text_flag(
        "cache_dir",
        None,
        "the model-call cache's directory, shared by every run that names it (`batch-runner cache --stats` shows it)",
        shown="`$XDG_CACHE_HOME/batch-runner/model-calls`, else `~/.cache/...`",
        group="model",
    ),
    text_flag(
        "cache_expiry",
        "1W",
        "how long a stored reply is used, in Inspect's spelling: a whole number and s, m, h, D, W, M or Y "
        "(1D: a day), or never",
        check.expiry,
        group="model",
    ),
    text_flag(
        "cache_size",
        "10g",
        "the model-call cache's bound: past it the least recently used replies are removed",
        check.size("1m"),
        group="model",
    ),
    Flag(
        "request_timeout",
        600.0,
        "seconds a model call may take, connecting to its last byte, before it is retried",
        check.seconds,
        group="model",
    ),
    Flag(
        "max_retries",
        5,
        "retries of a model call (429 honouring Retry-After, 408, 409, 5xx, timeouts, dropped connections, "
        "malformed replies; other 4xx fail at once) before the sample's attempt fails",
        integer(0, 100),
        group="model",
    ),
    text_flag("local_model_path", None, "GGUF file for --model=local", shown="SmolLM2-135M", group="model"),
)
