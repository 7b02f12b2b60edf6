"""The moa toolset: mixture_of_agents asks several reference models at once, then one model combines them.

Reference models are --moa_models (the tool is offered only when some are set); they answer in parallel
through --base_url with --api_key. The aggregator, --moa_aggregator (default --model), then writes one
answer from theirs. Every call's token usage counts into the prompt's usage. No environment variables.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tool_registry import Tool, ToolContext, ToolSettings, register

if TYPE_CHECKING:
    import openai

MAX_PARALLEL = 8
AGGREGATOR_SYSTEM = (
    "You are given answers from several models to the user's request below. Synthesize them into one answer "
    "of the highest quality: weigh them critically, keep what is correct and useful, fix or drop what is "
    "wrong or unsupported, and do not simply copy any one of them or mention that there were several. "
    "Answer the user directly.\n\nAnswers from the models:"
)
_THINK = re.compile(r"<(think|REASONING_SCRATCHPAD)>.*?</\1>", re.S | re.I)


@dataclass
class Answer:
    """One model call's outcome: its text or the error, and its usage either way."""

    model: str
    text: str = ""
    error: str | None = None
    usage: Any = None


def ask(client: openai.OpenAI, model: str, messages: list[dict]) -> Answer:
    """Call one model; failures come back in the Answer, never raised, so the other calls go on."""
    import openai

    try:
        reply = client.chat.completions.create(model=model, messages=messages)
    except openai.APIError as e:
        return Answer(model, error=f"{type(e).__name__}: {e}")
    raw = reply.choices[0].message.content if reply.choices else None
    text = _THINK.sub("", raw or "").strip()  # reasoning blocks would only crowd the aggregator's context
    return Answer(model, text=text, error=None if text else "empty reply", usage=reply.usage)


def mixture_of_agents(args: dict, ctx: ToolContext) -> dict:
    import openai  # imported here: ~0.5 s at start-up, and most runs never call this tool

    prompt = args.get("user_prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return {"response": "", "error": "user_prompt must be a non-empty string"}
    settings = ctx.settings
    models = list(settings.moa_models)
    if not models:
        return {"response": "", "error": unavailable(settings)}
    aggregator = settings.moa_aggregator or settings.model
    question = [{"role": "user", "content": prompt}]
    with openai.OpenAI(
        base_url=settings.base_url, api_key=settings.api_key or "none", timeout=settings.request_timeout
    ) as c:
        with ThreadPoolExecutor(max_workers=min(len(models), MAX_PARALLEL)) as pool:
            answers = list(pool.map(lambda model: ask(c, model, question), models))
        for answer in answers:  # summed here, after the threads, so Usage needs no lock
            ctx.usage.add(answer.usage)
        good = [a for a in answers if not a.error]
        failed = {a.model: a.error for a in answers if a.error}
        if not good:
            details = "; ".join(f"{m}: {e}" for m, e in failed.items())
            return {"response": "", "failed_models": failed, "error": f"every reference model failed ({details})"}
        listing = "\n\n".join(f"{i}. {a.text}" for i, a in enumerate(good, 1))
        final = ask(c, aggregator, [{"role": "system", "content": f"{AGGREGATOR_SYSTEM}\n\n{listing}"}, *question])
        ctx.usage.add(final.usage)
    result = {"response": final.text, "reference_models": [a.model for a in good], "failed_models": failed}
    result["error"] = f"aggregator {aggregator} failed: {final.error}" if final.error else None
    return result


def unavailable(settings: ToolSettings) -> str | None:
    """Why mixture_of_agents cannot be offered: no reference models configured."""
    return None if settings.moa_models else "no reference models configured: set --moa_models (comma-separated)"


MIXTURE_OF_AGENTS = register(
    Tool(
        name="mixture_of_agents",
        description=(
            "Get a carefully considered answer to a hard question: several strong models answer it independently "
            "and their answers are combined into one. Slow and costly; use it for difficult reasoning, not lookups."
        ),
        parameters={
            "type": "object",
            "properties": {
                "user_prompt": {"type": "string", "description": "The complete question or task, self-contained."}
            },
            "required": ["user_prompt"],
        },
        handler=mixture_of_agents,
        unavailable=unavailable,
    )
)
