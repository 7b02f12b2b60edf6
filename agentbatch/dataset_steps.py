"""A dataset's steps in the runner around a session (docs/datasets.md, "Steps in the runner").

Before any sample starts (`prepare`): the format's own `prepare` if it has one, then every entry's own time
limits bounded by the run's flags, then the images and builds the entries name made ready by their backend
(`Backend.prepare_all`: images built once, in parallel), each entry taking the image its samples run in and,
when that could not be had, the reason its samples fail at once; then the format's `ready` if it has one, which
may make more images the same way and name toolsets of its entries' own (added to the run's tool set). At the
session's end (`at_end`): the format's `at_end`, whose lines (a verdict over the run) are printed after the
session's summary.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from agentbatch.dataset import Entry
from agentbatch.dataset_formats import DatasetFormat
from agentbatch.errors import FatalError
from agentbatch.limits import TimeoutBounds
from agentbatch.model import registry as models
from agentbatch.sandboxes import registry as sandbox_backends
from agentbatch.sandboxes.base import ImageBuild, Prepared, Resources, SandboxSpec
from agentbatch.work import RunConfig


@dataclass(frozen=True)
class RunContext:
    """What a format's steps in the runner get of the run: its directory, its model, where to say things; and in
    `ready`, once the entries' images are made, what it takes to make more and to make a sandbox like a sample's."""

    run_dir: str  # data/<run_name>/: read it, or write a file of the format's own (the session holds the lock)
    model: str  # the run's --model
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)
    # `ready` only: images made as the entries' were (their backend's prepare_all, timeouts scaled), in order.
    make_images: Callable[[list[ImageBuild]], list[Prepared]] | None = None
    sandbox: SandboxSpec | None = None  # the run's settings, labels and name: `replace` it for a sandbox of its own
    taken: frozenset[str] = frozenset()  # the run's toolset and tool names, which an entry's own may not reuse


# What `ready` returns: the toolsets of the entries' own (name -> its tools, and where they come from), which the
# run's tool set then holds (tools.json, every line's tool_stats), offered to those entries' samples alone.
OwnToolsets = dict[str, tuple[tuple[str, ...], str]]


def refuse_other_formats(model: str, fmt: DatasetFormat) -> None:
    """FatalError when the run's model is registered for other dataset formats only (model.registry.refusal)."""
    refused = models.refusal(model, fmt.name)
    if refused:
        raise FatalError(refused)


def prepare(
    fmt: DatasetFormat, entries: list[Entry], run: RunContext, bounds: TimeoutBounds, cfg: RunConfig, parallel: int
) -> OwnToolsets:
    """Everything before any sample starts, on the entries in place (module docstring); `parallel`: how many
    images may be built at once (--sandbox_starts, else one per core). Returns the toolsets of the entries' own."""
    own = getattr(fmt, "prepare", None)
    if own is not None:
        own(entries, run)
    for e in entries:
        e.limits = bounds.bound(e.limits)

    def log(line: str) -> None:
        run.log(f"{fmt.name}: {line}")

    prepare_sandboxes(entries, bounds, cfg, parallel, log)
    ready = getattr(fmt, "ready", None)
    if ready is None:
        return {}

    def make_images(builds: list[ImageBuild]) -> list[Prepared]:
        labels = dict(cfg.sandbox_labels)
        specs = [
            SandboxSpec(
                cfg.sandbox, run_name=cfg.run_name, labels=labels, build=replace(b, timeout=bounds.scaled(b.timeout))
            )
            for b in builds
        ]
        return sandbox_backends.get(cfg.sandbox.image_kind).prepare_all(specs, parallel, log) if specs else []

    taken = frozenset((*cfg.tool_set.toolsets, *cfg.tool_set.names))
    spec = SandboxSpec(cfg.sandbox, run_name=cfg.run_name, labels=dict(cfg.sandbox_labels))
    return ready(entries, replace(run, make_images=make_images, sandbox=spec, taken=taken)) or {}


def prepare_sandboxes(
    entries: list[Entry], bounds: TimeoutBounds, cfg: RunConfig, parallel: int, log: Callable[[str], None]
) -> None:
    """Each distinct image, build or Compose project the entries name, made ready once by its backend; the entries
    told the outcome.

    An entry takes the image its samples run in (a build's tag), its metadata that image and the engine's id of
    it (the line's `task.image`, `task.image_id`; null without one), and the reason when it could not be had
    (`unavailable`).
    """
    keys: list[tuple | None] = []
    specs: dict[tuple, SandboxSpec] = {}
    for e in entries:
        if e.unavailable or not (e.image or e.build):
            keys.append(None)
            continue
        build = replace(e.build, timeout=bounds.scaled(e.build.timeout)) if e.build else None
        compose = e.resources.compose if e.resources else None  # its services' builds and start: their time limit
        if compose is not None:
            compose = replace(compose, timeout=bounds.scaled(compose.timeout))
            e.resources = replace(e.resources, compose=compose)
        resources = Resources(compose=compose) if compose else None
        spec = SandboxSpec(
            cfg.sandbox,
            e.image,
            run_name=cfg.run_name,
            labels=dict(cfg.sandbox_labels),
            build=build,
            resources=resources,
        )
        keys.append((spec.kind, e.image, e.build, compose))
        specs.setdefault(keys[-1], spec)
    made: dict[tuple, Prepared] = {}
    for kind in dict.fromkeys(key[0] for key in specs):
        same = [key for key in specs if key[0] == kind]
        done = sandbox_backends.get(kind).prepare_all([specs[k] for k in same], parallel, log)
        made.update(zip(same, done, strict=True))
    for e, key in zip(entries, keys, strict=True):
        prepared = made.get(key) if key is not None else None
        if prepared is not None:
            e.image = prepared.image or e.image
            e.unavailable = prepared.error or e.unavailable
        if e.metadata is None:
            continue
        if prepared is not None:
            e.metadata = {**e.metadata, "image": e.image, "image_id": prepared.image_id}
        else:  # no image made: the line's task still has the keys every line's has
            e.metadata = {"image": e.image, "image_id": None, **e.metadata}


def sandbox_note(fmt: DatasetFormat, note: str) -> str:
    """The line that says where the samples run: the format's own when it has one (its entries make their own
    sandboxes), else the run's sandbox's."""
    return getattr(fmt, "sandbox_note", None) or note


def at_end(
    fmt: DatasetFormat, entries: list[Entry], run: RunContext, then: Callable[[int], int] | None
) -> Callable[[int], int] | None:
    """The session's last step: the format's `at_end` (its lines printed after the summary), then `then`
    (the exports and the report asked for), given the exit code while the session still holds the run."""
    own = getattr(fmt, "at_end", None)
    if own is None:
        return then

    def at_session_end(code: int) -> int:
        for line in own(entries, run) or ():
            print(line)
        return then(code) if then is not None else code

    return at_session_end
