"""What the worker processes pacing their calls to one endpoint tell each other, through files in the
session's pacing directory: the endpoint's rate as the first of them found it (so a later one starts from
it), and how many calls a second each one is sending now (so one whose calls wait can take up what an idle
one leaves, as the last samples of a run drain from some workers before others). Every file is written whole
and renamed, so none is read half-written; one that cannot be read counts as nothing said."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading

FRESH = 2.0  # seconds a worker's word on what it sends holds (a pause is up to a second of silence)


class Peers:
    """This process's view of the others pacing calls to the same endpoint (alone when there is no directory)."""

    def __init__(self, directory: str | None, base_url: str, me: str | None = None):
        self.directory = directory
        self.stem = hashlib.blake2b(base_url.encode(), digest_size=8).hexdigest()
        self.me = me or str(os.getpid())  # which worker this is (its process id)

    def known_rate(self) -> float | None:
        """The endpoint's rate over all workers, as the workers found it, or None."""
        rate = _read(self._path(".json")).get("rate")
        return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None

    def tell_rate(self, rate: float) -> None:
        _write(self._path(".json"), {"rate": rate})

    def tell_sending(self, rate: float, now: float) -> None:
        """Calls a second this process sends now (`now`: time.monotonic, one clock for every process here)."""
        _write(self._path(f".{self.me}.sending"), {"rate": rate, "at": now})

    def others_sending(self, now: float) -> float:
        """Calls a second the other workers said they send, within the last FRESH seconds."""
        if not self.directory:
            return 0.0
        mine = f"{self.stem}.{self.me}.sending"
        total = 0.0
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                if entry.name.startswith(self.stem) and entry.name.endswith(".sending") and entry.name != mine:
                    said = _read(entry.path)
                    rate, at = said.get("rate"), said.get("at")
                    if isinstance(rate, (int, float)) and isinstance(at, (int, float)) and now - at <= FRESH:
                        total += max(0.0, rate)
        return total

    def _path(self, suffix: str) -> str | None:
        return os.path.join(self.directory, self.stem + suffix) if self.directory else None


def _read(path: str | None) -> dict:
    try:
        with open(path or "", encoding="utf-8") as f:
            said = json.load(f)
    except (OSError, ValueError):
        return {}
    return said if isinstance(said, dict) else {}


def _write(path: str | None, said: dict) -> None:
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(said, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
