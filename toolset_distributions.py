"""The toolsets, their tools, and the distributions that sample toolsets per prompt with a seeded RNG."""

from __future__ import annotations

import random
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
    """A named set of independent per-toolset probabilities (percent)."""

    name: str
    description: str
    probabilities: dict[str, int]

    def ranked(self) -> list[tuple[str, int]]:
        """Toolsets by probability, highest first (ties in TOOLSET_ORDER)."""
        return sorted(self.probabilities.items(), key=lambda kv: (-kv[1], TOOLSET_ORDER.index(kv[0])))


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


class UnknownDistribution(ValueError):
    """No distribution has that name."""


def get_distribution(name: str) -> Distribution:
    """The distribution of that name, or an error listing the valid names."""
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        raise UnknownDistribution(
            f"unknown distribution {name!r}; choose one of: {', '.join(DISTRIBUTIONS)} (see --list_distributions)"
        ) from None


def prompt_rng(seed: int | None, prompt_index: int) -> random.Random:
    """An RNG that depends only on the seed and the prompt, not on which worker runs it or when."""
    if seed is None:
        return random.Random()
    return random.Random(f"{seed}:{prompt_index}")


def sample_toolsets(dist: Distribution, rng: random.Random) -> list[str]:
    """Flip each toolset independently; if none came up, take the most probable (first listed on ties)."""
    chosen = [ts for ts in TOOLSET_ORDER if ts in dist.probabilities and rng.random() * 100 < dist.probabilities[ts]]
    return chosen or [dist.ranked()[0][0]]


def format_distributions() -> str:
    """The --list_distributions text: name, description, toolsets by probability."""
    lines = []
    for d in DISTRIBUTIONS.values():
        lines.append(f"{d.name}: {d.description}")
        lines.append("    " + ", ".join(f"{ts} {p}%" for ts, p in d.ranked()))
    return "\n".join(lines)
