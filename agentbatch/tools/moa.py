"""The moa toolset: mixture_of_agents asks several reference models at once, then one model combines them.

Reference models are --moa_models (the tool is offered only when some are set); they answer in parallel
through the run's model client. The aggregator, --moa_aggregator (default --model), then writes one answer
from theirs. Every call is retried and its token usage counted like the agent's own.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated

from agentbatch.model.base import ModelCallError
from agentbatch.tools.context import ToolContext
from agentbatch.tools.registry import tool
from agentbatch.tools.settings import ToolSettings

MAX_PARALLEL = 8
AGGREGATOR_SYSTEM = (
    "You are given answers from several models to the user's request below. Synthesize them into one answer "
    "of the highest quality: weigh them critically, keep what is correct and useful, fix or drop what is "
    "wrong or unsupported, and do not simply copy any one of them or mention that there were several. "
    "Answer the user directly.\n\nAnswers from the models:"
)


@dataclass
class Answer:
    """One model's answer, or why it failed."""

    model: str
    text: str = ""
    error: str | None = None


def ask(ctx: ToolContext, model: str, messages: list[dict]) -> Answer:
    """Call one model; failures come back in the Answer, never raised, so the other calls go on."""
    try:
        text = ctx.ask(messages, model)  # reasoning is left out: it would only crowd the aggregator's context
    except ModelCallError as e:
        return Answer(model, error=str(e))
    return Answer(model, text=text, error=None if text else "empty reply")


@tool(unavailable=lambda settings: unavailable(settings))
def mixture_of_agents(
    ctx: ToolContext, user_prompt: Annotated[str, "The complete question or task, self-contained."]
) -> dict:
    """Get a carefully considered answer to a hard question: several strong models answer it independently
    and their answers are combined into one. Slow and costly; use it for difficult reasoning, not lookups."""
    if not user_prompt.strip():
        return {"response": "", "error": "user_prompt must be a non-empty string"}
    settings = ctx.settings
    models = list(settings.moa_models)
    if not models:
        return {"response": "", "error": unavailable(settings)}
    aggregator = settings.moa_aggregator or ctx.client.settings.model
    question = [{"role": "user", "content": user_prompt}]
    with ThreadPoolExecutor(max_workers=min(len(models), MAX_PARALLEL)) as pool:
        answers = list(pool.map(lambda model: ask(ctx, model, question), models))
    good = [a for a in answers if not a.error]
    failed = {a.model: a.error for a in answers if a.error}
    if not good:
        details = "; ".join(f"{m}: {e}" for m, e in failed.items())
        return {"response": "", "failed_models": failed, "error": f"every reference model failed ({details})"}
    listing = "\n\n".join(f"{i}. {a.text}" for i, a in enumerate(good, 1))
    final = ask(ctx, aggregator, [{"role": "system", "content": f"{AGGREGATOR_SYSTEM}\n\n{listing}"}, *question])
    result = {"response": final.text, "reference_models": [a.model for a in good], "failed_models": failed}
    result["error"] = f"aggregator {aggregator} failed: {final.error}" if final.error else None
    return result


def unavailable(settings: ToolSettings) -> str | None:
    """Why mixture_of_agents cannot be offered: no reference models configured."""
    return None if settings.moa_models else "no reference models configured: set --moa_models (comma-separated)"
