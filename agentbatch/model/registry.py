"""Models by name: `--model=NAME` answered by a registered model instead of an endpoint.

A plug-in module (agentbatch/plugins.py) registers one with `@register_model("name")` on a factory that takes
the run's ModelSettings and returns a model.base.Model. Any other name is a model at the endpoint, called
through the HTTP client (client.ModelClient).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentbatch.model.base import Model
from agentbatch.model.client import ModelClient, ModelSettings
from agentbatch.registry import Registry, origin_of

Factory = Callable[[ModelSettings], Model]


@dataclass(frozen=True)
class Registered:
    """A model answered without the endpoint (unless it says it needs one, e.g. a model that wraps the client)."""

    name: str
    factory: Factory
    needs_endpoint: bool = False
    implies: tuple[tuple[str, Any], ...] = ()  # flag values it implies, for the flags a run does not give
    dataset_formats: tuple[str, ...] = ()  # the only dataset formats it runs (empty: any)
    refusal: str = ""  # the one line that refuses a dataset of another format


MODELS: Registry[Registered] = Registry("model")


def register_model(
    name: str,
    needs_endpoint: bool = False,
    implies: dict[str, Any] | None = None,
    dataset_formats: tuple[str, ...] = (),
    refusal: str = "",
) -> Callable[[Factory], Factory]:
    """Answer `--model=name` with the decorated factory's model (one per worker, shared by its slots).

    `implies`: flag values this model needs unless the run gives them (--model=oracle: its one terminal command,
    no reasoning); `dataset_formats`: the formats it runs, a dataset of any other refused with `refusal`.
    """

    def declare(factory: Factory) -> Factory:
        registered = Registered(name, factory, needs_endpoint, tuple((implies or {}).items()), dataset_formats, refusal)
        MODELS.add(name, registered, origin_of(factory))
        return factory

    return declare


def implied_flags(name: str) -> dict[str, Any]:
    """The flag values `--model=name` implies for the flags a run does not give (none for an endpoint's model)."""
    r = MODELS.get(name)
    return dict(r.implies) if r is not None else {}


def refusal(name: str, dataset_format: str) -> str | None:
    """Why `--model=name` cannot run a dataset of this format (its one line), or None if it can."""
    r = MODELS.get(name)
    if r is None or not r.dataset_formats or dataset_format in r.dataset_formats:
        return None
    return r.refusal or f"--model={name} runs only datasets of the {', '.join(r.dataset_formats)} format"


def registered(name: str) -> Registered | None:
    return MODELS.get(name)


def needs_endpoint(name: str) -> bool:
    """Whether `--model=name` calls the endpoint (and so needs its URL and, for hosted ones, a key)."""
    r = MODELS.get(name)
    return r is None or r.needs_endpoint


def make(settings: ModelSettings) -> Model:
    """The run's model: the one registered under its name, else the endpoint's through the HTTP client."""
    r = MODELS.get(settings.model)
    return r.factory(settings) if r is not None else ModelClient(settings)
