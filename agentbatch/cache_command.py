"""`batch-runner cache`: the model-call cache looked at (--stats) or emptied (--clear), docs/replay.md."""

from __future__ import annotations

import sys
import time

from agentbatch import flags, settings
from agentbatch.errors import FatalError

USAGE = """usage: batch-runner cache --stats|--clear [--cache_dir=DIR] [--cache_expiry=1W]

  --stats         what the model-call cache holds: replies, size, models, and how many are past --cache_expiry
  --clear         remove every reply (a file that is not a cache is removed whole)
  --cache_dir     the cache's directory (default: $XDG_CACHE_HOME/batch-runner/model-calls, else ~/.cache/...)
  --cache_expiry  the expiry --stats counts against (Inspect's spelling: 12h, 1D, 4W; never)
"""
_OWN = ("stats", "clear", "help")
_VALUED = ("cache_dir", "cache_expiry")


def main(argv: list[str]) -> int:
    """Run the subcommand; its exit code (a bad argument is a FatalError: one line, exit 2)."""
    args = _parse(argv)
    if args.get("help"):
        print(USAGE, end="")
        return 0
    if bool(args.get("stats")) == bool(args.get("clear")):
        raise FatalError("batch-runner cache needs one of --stats or --clear (see batch-runner cache --help)")
    m = settings.build({k: v for k, v in args.items() if k in _VALUED}).model  # checked as a run's flags are
    from agentbatch.model import cache_store
    from agentbatch.model.cache import default_directory

    directory = m.cache_dir or default_directory()
    if args.get("clear"):
        removed = cache_store.clear(directory)
        what = "a file that was not a model-call cache" if removed < 0 else f"{removed} replies"
        print(f"model-call cache {directory}: removed {what}")
        return 0
    try:
        found = cache_store.stats(directory, m.cache_expiry)
    except cache_store.StoreUnusable as e:
        raise FatalError(
            f"{directory} holds no usable model-call cache ({e}); batch-runner cache --clear starts it anew"
        ) from None
    print(describe(found, args.get("cache_expiry") or flags.BY_NAME["cache_expiry"].default))
    return 0


def describe(s, expiry_text: str) -> str:
    """The --stats text."""
    lines = [f"model-call cache: {s.path}", f"  {s.entries} replies, {_size(s.bytes)} on disk"]
    if s.entries:
        lines.append(f"  stored from {_when(s.oldest)} to {_when(s.newest)}; {s.expired} older than {expiry_text}")
        width = max(len("model"), *(len(m) for m, _ in s.by_model))
        lines.append(f"  {'model':<{width}}  replies")
        lines += [f"  {m:<{width}}  {n:>7}" for m, n in s.by_model]
    return "\n".join(lines)


def _parse(argv: list[str]) -> dict:
    out: dict = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            out["help"] = True
            i += 1
            continue
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        name = name.replace("-", "_")
        if name in _OWN and not eq:
            out[name] = True
        elif name in _VALUED:
            if not eq:
                if i + 1 == len(argv):
                    raise FatalError(f"--{name} needs a value")
                i += 1
                value = argv[i]
            out[name] = value
        else:
            raise FatalError(f"batch-runner cache: unknown argument {arg!r} (see batch-runner cache --help)")
        i += 1
    return out


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = n / 1024
    for unit in ("KB", "MB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def _when(t: float | None) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
