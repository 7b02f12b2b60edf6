"""Batch runner: a tool-using agent on every prompt of a JSONL file, in parallel, each in its own sandbox."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
from typing import Any

from agentbatch import command_line, flags
from agentbatch.errors import FatalError
from toolset_distributions import format_distributions


def main(**values: Any) -> None:
    verbose = flags.verbose(values)  # before the flags are checked: a bad value is named by its check
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        if flags.lists_distributions(values):
            if flags.names_own_toolsets(values):  # checked against the toolsets they name
                from agentbatch import launch

                print(launch.distributions_text(values))
            else:
                print(format_distributions())
            return
        from agentbatch import launch

        code = launch.run(values)
    except FatalError as e:
        _fatal(str(e), verbose)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # already quitting: another Ctrl-C must not become a traceback
        print("interrupted; run again with --resume to finish", file=sys.stderr)
        sys.exit(130)
    if code:
        if code == 130:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.exit(code)


# Fire reads the flags, their defaults and their help from these (agentbatch/flags.py declares each flag once).
main.__signature__ = flags.signature()
main.__doc__ = flags.docstring(
    "Run a tool-using agent on every prompt of a JSONL dataset and write ShareGPT trajectories.\n\n"
    "Output goes to <output_dir>/<run_name>/: batch_<N>.jsonl, trajectories.jsonl, statistics.json,\n"
    "checkpoint.json, failed.jsonl and discarded.jsonl. See README.md for the whole story."
)


def _fatal(message: str, verbose: bool) -> None:
    if verbose:
        logging.exception("fatal")
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def _cache_command(argv: list[str]) -> None:
    from agentbatch import cache_command

    try:
        code = cache_command.main(argv)
    except FatalError as e:
        _fatal(str(e), verbose=False)
    sys.exit(code)


def serve(argv: list[str]) -> None:
    """`batch_runner.py serve --port=P [the run's flags]`: rollouts over HTTP (docs/rollouts.md)."""
    if any(a in ("--help", "-h") for a in argv):
        print(
            "usage: batch_runner.py serve [--host=127.0.0.1] [--port=8470] [the run's flags]\n\n"
            "Rollouts over HTTP: POST /v1/rollouts streams one JSON line per finished group; GET /health.\n"
            "Every request needs Authorization: Bearer $BATCH_RUNNER_TOKEN (it does not start without one).\n"
            "The protocol and the Python API: docs/rollouts.md; the flags: --help without serve."
        )
        return
    values = command_line.keyword_values(argv)
    verbose = flags.verbose(values or {})
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(message)s")
    if values is None:
        bad = next((a for a in argv if a[2:].partition("=")[0].replace("-", "_") not in flags.BY_NAME), argv[0])
        _fatal(f"serve takes the run's flags, --host and --port as --flag=value; not {bad!r}", verbose)
    # SIGTERM stops it as Ctrl-C does: every sandbox removed, a run directory's session ended.
    signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGINT))
    try:
        from agentbatch import rollout_server

        code = rollout_server.serve(values)
    except FatalError as e:
        _fatal(str(e), verbose)
    sys.exit(code)


def cli() -> None:
    """Entry point of `python batch_runner.py` and the `batch-runner` console script."""
    argv = sys.argv[1:]
    if argv[:1] == ["serve"]:
        serve(argv[1:])
        return
    try:
        if command_line.is_cache_command(argv):  # `batch-runner cache --stats|--clear`
            _cache_command(argv[1:])
            return
        values = command_line.keyword_values(argv)
        if values is not None:  # the usual command line: read without importing Fire (command_line.py)
            main(**values)
            return
        import fire

        # main's **unknown (there to name a mistyped flag) would swallow --help as a flag; Fire shows help after "--".
        if any(a in ("--help", "-h") for a in argv):
            # Fire writes help to stderr; on stdout `batch-runner --help | less` works as users expect.
            with contextlib.redirect_stderr(sys.stdout):
                fire.Fire(main, command=["--", "--help"], name=os.path.basename(sys.argv[0]))
            return
        fire.Fire(main, command=flags.quote_text_flags(argv), name=os.path.basename(sys.argv[0]))
    finally:
        # The interpreter's last collections walked every object of the imported modules: ~0.2 s of the exit.
        gc.freeze()


if __name__ == "__main__":
    cli()
