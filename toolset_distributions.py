"""The toolsets, their tools, and the distributions that sample toolsets per prompt with a seeded RNG.

TOOLSETS and DISTRIBUTIONS are the built-ins; a run may add toolsets (tool modules, MCP servers) and
distributions (`--distributions_file`, read by `read_distributions`), which sample the same way.
"""

from __future__ import annotations

import json
import random
import reprlib
from collections.abc import Iterable
from dataclasses import dataclass

TOOLSETS: dict[str, tuple[str, ...]] = {
    "web": ("web_search", "web_extract"),
    "vision": ("vision_analyze",),
    "image_gen": ("image_generate",),
    "terminal": ("terminal",),
    "file": ("read_file", "write_file", "patch", "search_files"),
    "moa": ("mixture_of_agents",),
    "browser": (
        "browser_navigate",
        "browser_snapshot",
        "browser_click",
        "browser_type",
        "browser_scroll",
        "browser_back",
        "browser_press",
        "browser_close",
        "browser_get_images",
        "browser_vision",
    ),
}
TOOLSET_ORDER = tuple(TOOLSETS)
ALL_TOOL_NAMES: tuple[str, ...] = tuple(t for tools in TOOLSETS.values() for t in tools)
TOOLSET_OF: dict[str, str] = {t: ts for ts, tools in TOOLSETS.items() for t in tools}


@dataclass(frozen=True)
class Distribution:
    """A named set of independent per-toolset probabilities (percent), and the file that declared it if any."""

    name: str
    description: str
    probabilities: dict[str, float]
    source: str | None = None
    # The toolsets it names at 0%: never drawn, and never offered as the run's own (below).
    excluded: tuple[str, ...] = ()
    # The run's own toolsets (its --tools modules, its MCP servers) that it does not name: offered to every
    # sample beside what is drawn, with no draw, so the draws of the others stay what they were.
    always: tuple[str, ...] = ()

    def names(self) -> set[str]:
        """Every toolset it names, at 0% too."""
        return {*self.probabilities, *self.excluded}

    def order(self) -> list[str]:
        """Its toolsets in the order they are drawn: the built-ins' order, then the others as the file lists them."""
        builtin = [ts for ts in TOOLSET_ORDER if ts in self.probabilities]
        return builtin + [ts for ts in self.probabilities if ts not in TOOLSETS]

    def ranked(self) -> list[tuple[str, float]]:
        """Toolsets by probability, highest first (ties in drawing order)."""
        order = self.order()
        return sorted(self.probabilities.items(), key=lambda kv: (-kv[1], order.index(kv[0])))


def _d(name: str, description: str, *percents: int | None) -> Distribution:
    probs = {ts: p for ts, p in zip(TOOLSET_ORDER, percents, strict=True) if p}
    return Distribution(name, description, probs)


_ = None
DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d
    for d in (
        #  name, description,                                                   web vis img term file moa brow
        _d("default", "Every toolset, always.", 100, 100, 100, 100, 100, 100, 100),
        _d("image_gen", "Image generation and vision, with some web and terminal.", 55, 90, 90, 45, _, 10, _),
        _d("research", "Web research with vision, browsing and mixture-of-agents.", 90, 50, _, 10, _, 40, 70),
        _d("science", "Scientific work: web, terminal and files, some vision.", 94, 65, 15, 94, 94, 10, 50),
        _d("development", "Software development: terminal and files first.", 30, 10, _, 80, 80, 60, _),
        _d("safe", "No terminal or file access.", 80, 60, 60, _, _, 50, 70),
        _d("balanced", "Every toolset at even odds.", 50, 50, 50, 50, 50, 50, 50),
        _d("minimal", "Web search and extraction only.", 100, _, _, _, _, _, _),
        _d("terminal_only", "Terminal and files only.", _, _, _, 100, 100, _, _),
        _d("terminal_web", "Terminal, files and the web.", 100, _, _, 100, 100, _, _),
        _d("creative", "Image generation and vision, a little web.", 30, 90, 90, _, _, _, _),
        _d("reasoning", "Mixture-of-agents reasoning, a little web and terminal.", 30, _, _, 20, _, 90, _),
        _d("browser_use", "A browser with web search and vision.", 80, 70, _, _, _, _, 100),
        _d("browser_only", "The browser alone.", _, _, _, _, _, _, 100),
        _d("browser_tasks", "Browser tasks, rarely vision or terminal.", _, 12, _, 15, _, _, 97),
        _d("terminal_tasks", "Terminal tasks with web, files and browser.", 97, 50, 10, 97, 97, _, 75),
        _d("mixed_tasks", "Terminal, files and browser, some web.", 35, 15, 15, 92, 92, _, 92),
    )
}


class DistributionError(ValueError):
    """A distribution cannot be used: its name is unknown, or a distributions file is wrong (one line)."""


class UnknownDistribution(DistributionError):
    """No distribution has that name."""


def get_distribution(name: str, table: dict[str, Distribution] | None = None) -> Distribution:
    """The distribution of that name (in `table`, else the built-ins), or an error listing the valid names."""
    table = DISTRIBUTIONS if table is None else table
    try:
        return table[name]
    except KeyError:
        raise UnknownDistribution(
            f"unknown distribution {name!r}; choose one of: {', '.join(table)} (see --list_distributions)"
        ) from None


def with_file(path: str | None) -> dict[str, Distribution]:
    """The built-in distributions, and those of a --distributions_file (a name it reuses replaces the built-in)."""
    return {**DISTRIBUTIONS, **read_distributions(path)} if path else dict(DISTRIBUTIONS)


def read_distributions(path: str) -> dict[str, Distribution]:
    """The distributions of a --distributions_file (JSON, or YAML): `{name: {toolset: percent}}` or
    `{name: {"description": ..., "toolsets": {toolset: percent}}}`; DistributionError naming the first problem."""
    where = f"--distributions_file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise DistributionError(f"{where}: cannot read it: {e.strerror or e}") from None
    data = _decode(text, path, where)
    if not isinstance(data, dict) or not data:
        raise DistributionError(f"{where}: expected an object of distributions: {{name: {{toolset: percent}}}}")
    return {
        name: _distribution(name, value, f"{where}: distribution {_excerpt(name)}", path)
        for name, value in data.items()
    }


def _decode(text: str, path: str, where: str) -> object:
    if not path.endswith((".yaml", ".yml")):
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as e:
            if path.endswith(".json"):
                raise DistributionError(f"{where}: not JSON: {_why(e)}") from None
    try:
        import yaml
    except ImportError:
        raise DistributionError(f"{where}: reading YAML needs PyYAML (pip install pyyaml)") from None
    try:
        return yaml.load(text, Loader=_no_aliases(yaml, where))  # a SafeLoader's, refusing aliases
    except DistributionError:
        raise
    except (yaml.YAMLError, ValueError, RecursionError) as e:
        raise DistributionError(f"{where}: not JSON or YAML: {_why(e)}") from None


def _no_aliases(yaml, where: str):
    """PyYAML's SafeLoader refusing aliases: a few hundred bytes of nested `*a` would be billions of values
    wherever the file's contents are walked or shown (a "billion laughs"); a distributions file needs none."""

    class NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise DistributionError(
                    f"{where}: line {event.start_mark.line + 1}: YAML aliases (*{_toolset(event.anchor)}) are not "
                    "accepted: write the value out"
                )
            return super().compose_node(parent, index)

    return NoAliases


def _why(e: BaseException) -> str:
    """A decoder's error as one short line."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    text = " ".join(str(e).split())
    if "integer string conversion" in text:  # Python's limit on the digits of an integer (4300)
        return "a number has too many digits"
    return text[:200]


# An error quotes a value the file gave (a name, a toolset, a percent) in at most this many characters, whatever
# its size: a repr of the whole of it may be megabytes. The agentbatch package has its own (flag_checks.shown):
# this module imports nothing of it.
_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxdict, _EXCERPT.maxlist = 2, 3, 3
_EXCERPT.maxstring = _EXCERPT.maxother = _EXCERPT.maxlong = 40


def _excerpt(value: object) -> str:
    """The value as an error quotes it: its repr, at most ~60 characters however large the value."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"a {'negative ' if value < 0 else ''}number of about {int(value.bit_length() * 0.30103)} digits"
    return _EXCERPT.repr(value)[:60]


def _toolset(value: object) -> str:
    """A toolset the file names, as an error quotes it (a string as it is, cut to 60 characters)."""
    if not isinstance(value, str):
        return _excerpt(value)
    return value if len(value) <= 60 else value[:57] + "..."


def _distribution(name: object, value: object, where: str, source: str) -> Distribution:
    if not isinstance(name, str) or not name.strip():
        raise DistributionError(f"{where}: a name must be a non-empty string")
    description = ""
    if isinstance(value, dict) and "toolsets" in value and set(value) <= {"toolsets", "description"}:
        description, value = value.get("description") or "", value["toolsets"]
        if not isinstance(description, str):
            raise DistributionError(f"{where}: description must be a string")
    if not isinstance(value, dict) or not value:
        raise DistributionError(f'{where}: expected toolsets with a percent each, e.g. {{"web": 50}}')
    probabilities: dict[str, float] = {}
    for toolset, percent in value.items():
        if isinstance(percent, bool) or not isinstance(percent, int | float) or not 0 <= percent <= 100:
            raise DistributionError(f"{where}: {_toolset(toolset)}: {_excerpt(percent)} is not a percent from 0 to 100")
        if percent:
            probabilities[str(toolset)] = int(percent) if float(percent).is_integer() else float(percent)
    if not probabilities:
        raise DistributionError(f"{where}: every toolset is at 0%")
    excluded = tuple(str(ts) for ts in value if str(ts) not in probabilities)
    return Distribution(name, " ".join(description.split()), probabilities, source, excluded)


def check_toolsets(table: dict[str, Distribution], toolsets: Iterable[str]) -> None:
    """DistributionError for the first distribution naming a toolset that is not among `toolsets`."""
    known = list(toolsets)
    for d in table.values():
        unknown = [ts for ts in d.probabilities if ts not in known]
        if unknown:
            where = (
                f"--distributions_file {d.source}: distribution {d.name!r}" if d.source else f"distribution {d.name!r}"
            )
            raise DistributionError(
                f"{where} names the toolset {_excerpt(unknown[0])}, which this run does not have; "
                f"its toolsets: {', '.join(known)}"
            )


def prompt_rng(seed: int | None, prompt_index: int) -> random.Random:
    """An RNG that depends only on the seed and the prompt, not on which worker runs it or when."""
    if seed is None:
        return random.Random()
    return random.Random(f"{seed}:{prompt_index}")


def sample_toolsets(dist: Distribution, rng: random.Random) -> list[str]:
    """Flip each toolset independently; if none came up, take the most probable (first listed on ties); then
    add the run's own toolsets it does not name (`always`)."""
    chosen = [ts for ts in dist.order() if rng.random() * 100 < dist.probabilities[ts]]
    return (chosen or [dist.ranked()[0][0]]) + [ts for ts in dist.always if ts not in dist.probabilities]


def format_distributions(table: dict[str, Distribution] | None = None) -> str:
    """The --list_distributions text: name, description, toolsets by probability (and the file of each it read)."""
    lines = []
    for d in (DISTRIBUTIONS if table is None else table).values():
        source = f"(from {d.source})" if d.source else ""
        lines.append(f"{d.name}: " + " ".join(part for part in (d.description, source) if part))
        lines.append("    " + ", ".join(f"{ts} {p}%" for ts, p in d.ranked()))
    return "\n".join(lines)
