"""`batch_runner.py serve` (docs/rollouts.md): where it listens.

The `serve` group of the settings (settings.ServeFlags); a new flag's place in --help and docs/flags.md
is its name's in flags.ORDER.
"""

from __future__ import annotations

from agentbatch.flag_type import Flag, integer, text_flag

FLAGS: tuple[Flag, ...] = (
    text_flag("host", "127.0.0.1", "`serve`: the address it listens on (each request needs the token)", group="serve"),
    Flag("port", 8470, "`serve`: the port it listens on (0: any free one)", integer(0, 65535), group="serve"),
)
