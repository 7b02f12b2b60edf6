"""The model-call cache's store: one SQLite file (WAL) that every worker of every run on the machine reads and writes.

SQLite is the kept library that makes this safe: WAL lets readers go on while one process writes, and a write
waits its turn (the busy timeout) instead of failing, so any number of processes share one file. A value is
the reply's JSON, zlib-compressed (whose checksum catches damaged bytes), with the entry's key inside it (a
value under another key is caught too). A value that is damaged, of another shape, past the expiry or under
the wrong key is a miss; a file that is not a store at all (a torn copy, another program's) makes every call a
miss, said once per process, until `batch-runner cache --clear` starts it anew. Nothing here ever raises into a
model call.

Past `max_bytes` the least recently used entries are removed (an entry's use is noted at most once a minute,
so a hit rarely writes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sqlite3
import threading
import time
import zlib
from dataclasses import dataclass

from agentbatch.model.base import Reply

log = logging.getLogger(__name__)

FILE = "model-calls.sqlite3"
SCHEMA_VERSION = 1
BUSY_SECONDS = 60.0  # how long a write waits for other processes' before it gives up (then: not stored)
TOUCH_SECONDS = 60.0  # an entry's last use is rewritten at most this often
KEEP_FRACTION = 0.9  # eviction goes down to this share of the bound, so it does not run at every store
_DECODER = json.JSONDecoder(object_hook=Reply)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key BLOB PRIMARY KEY,
    model TEXT NOT NULL,
    created REAL NOT NULL,
    used REAL NOT NULL,
    size INTEGER NOT NULL,
    value BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_used ON entries (used);
"""


class StoreUnusable(Exception):
    """The file is not a store this runner can use (not SQLite, damaged, another version, not writable)."""


@dataclass
class Stats:
    """What `batch-runner cache --stats` prints."""

    path: str
    entries: int = 0
    bytes: int = 0
    oldest: float | None = None
    newest: float | None = None
    expired: int = 0  # older than the expiry asked about
    by_model: list[tuple[str, int]] | None = None


class Store:
    """The store of one cache directory, for one process: one connection, shared by its threads under a lock."""

    def __init__(self, directory: str, max_bytes: int, expiry: float | None):
        self.path = os.path.join(directory, FILE)
        self.directory = directory
        self.max_bytes = max_bytes
        self.expiry = expiry
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = 0
        self._inherited: list[sqlite3.Connection] = []  # a parent's, never used or closed here (not across fork)
        self._broken: str | None = None
        self.misses_corrupt = 0

    def open(self) -> None:
        """Make the store ready now (at a run's start): StoreUnusable with the reason if it cannot be."""
        self._run(lambda conn: None)

    def get(self, key: bytes, expected: str) -> Reply | None:
        """The reply stored under `key`, or None: absent, past the expiry, damaged, or the store unusable."""
        try:
            row = self._run(
                lambda c: c.execute("SELECT created, used, value FROM entries WHERE key = ?", (key,)).fetchone()
            )
        except (sqlite3.Error, StoreUnusable, OSError) as e:
            self._unusable(e)
            return None
        if row is None:
            return None
        created, used, value = row
        now = time.time()
        if self.expiry is not None and now - created > self.expiry:
            return None
        reply = _decode(value, key, expected)
        if reply is None:
            self.misses_corrupt += 1
            return None
        if now - used > TOUCH_SECONDS:
            with self._lock, contextlib.suppress(sqlite3.Error, StoreUnusable, OSError):  # busy: next time
                self._connection().execute("UPDATE entries SET used = ? WHERE key = ?", (now, key))
        return reply

    def put(self, key: bytes, model: str, reply: str) -> None:
        """Store a reply (its JSON text) under `key`, replacing what was there, then keep the store within its bound."""
        value = zlib.compress(f'{{"key": "{key.hex()}", "reply": {reply}}}'.encode(), 6)
        now = time.time()

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO entries (key, model, created, used, size, value) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET model = excluded.model, created = excluded.created, "
                "used = excluded.used, size = excluded.size, value = excluded.value",
                (key, model, now, now, len(value), value),
            )
            self._evict(conn)

        try:
            self._run(write)
        except (sqlite3.Error, StoreUnusable, OSError) as e:
            self._unusable(e)

    def _run(self, step):
        """step(connection)'s result; while another process holds the lock it needs, again after a short sleep, this
        process's other threads free to use the connection meanwhile (SQLite's own busy wait would hold it, backing
        off to 0.1 s a try)."""
        deadline = time.monotonic() + BUSY_SECONDS
        delay = 0.0005
        while True:
            with self._lock:
                try:
                    return step(self._connection())
                except sqlite3.OperationalError as e:
                    if not _busy(e) or time.monotonic() > deadline:
                        raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.01)

    def _connection(self) -> sqlite3.Connection:
        if self._broken is not None:
            raise StoreUnusable(self._broken)
        if self._conn is not None and self._pid == os.getpid():
            return self._conn
        if self._conn is not None:  # forked: the parent's connection must not be used, nor closed, here
            self._inherited.append(self._conn)
            self._conn = None
        os.makedirs(self.directory, exist_ok=True)
        # No busy timeout of SQLite's: a write that meets another process's waits in _write, without the lock.
        conn = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
        try:
            _retried(lambda: _ready(conn))
        except BaseException:
            conn.close()
            raise
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _evict(self, conn: sqlite3.Connection) -> None:
        """Remove the least recently used entries while the store's pages in use pass the bound."""
        for _ in range(8):
            used = _bytes_in_use(conn)
            if used <= self.max_bytes:
                return
            count, total = conn.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM entries").fetchone()
            if count <= 1:
                return
            # Entry sizes are their values'; pages hold more (keys, indexes, slack): scale by what the file says.
            per_entry = max(1.0, used / count)
            n = max(1, min(count - 1, int((used - KEEP_FRACTION * self.max_bytes) / per_entry) + 1))
            conn.execute("DELETE FROM entries WHERE key IN (SELECT key FROM entries ORDER BY used LIMIT ?)", (n,))

    def _unusable(self, e: Exception) -> None:
        """A store that fails is only not used: said once per process, never raised into the model call."""
        if isinstance(e, sqlite3.OperationalError) and "locked" in str(e):
            log.info("model-call cache busy, this call not cached: %s", e)  # a write that waited too long
            return
        if self._broken is None:
            self._broken = str(e)
            log.warning(
                "the model-call cache %s cannot be used (%s): every call goes to the endpoint; "
                "`batch-runner cache --clear` starts it anew",
                self.path,
                e,
            )

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None


def _busy(e: sqlite3.OperationalError) -> bool:
    text = str(e)
    return "locked" in text or "busy" in text


def _retried(fn, seconds: float = BUSY_SECONDS) -> None:
    """fn(), again after a moment while another process holds the lock it needs (the schema made at first use)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if not _busy(e) or time.monotonic() > deadline:
                raise
        time.sleep(random.uniform(0.001, 0.01))


def _ready(conn: sqlite3.Connection) -> None:
    """WAL, the schema (made once by whichever process comes first), and a version this code reads."""
    try:
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    except sqlite3.OperationalError as e:
        if _busy(e):
            raise  # another process is making the file a store right now: _retried asks again
        raise StoreUnusable(f"not a model-call cache ({e})") from e
    except sqlite3.DatabaseError as e:
        raise StoreUnusable(f"not a model-call cache ({e})") from e
    if str(mode).lower() != "wal":
        raise StoreUnusable(f"its journal cannot be WAL here (it is {mode})")
    conn.execute("PRAGMA synchronous = NORMAL")  # a cache may lose its last writes to a power cut, never its file
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        elif version != SCHEMA_VERSION:
            raise StoreUnusable(f"written by another version of the runner (schema {version})")
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _bytes_in_use(conn: sqlite3.Connection) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]


def _decode(value: object, key: bytes, expected: str) -> Reply | None:
    """The stored reply, or None if the value is damaged, of another shape, or another key's."""
    if not isinstance(value, bytes):
        return None
    try:
        payload = _DECODER.decode(zlib.decompress(value).decode())
    except (zlib.error, ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or payload.get("key") != key.hex():
        return None
    reply = payload.get("reply")
    if not isinstance(reply, dict):
        return None
    found = reply.get(expected)
    if not isinstance(found, list) or not found or not all(isinstance(x, dict) for x in found):
        return None
    if expected == "choices" and not isinstance(found[0].get("message"), dict):
        return None
    return reply


def stats(directory: str, expiry: float | None) -> Stats:
    """What the store holds (StoreUnusable if it is not one); an absent store holds nothing."""
    path = os.path.join(directory, FILE)
    found = Stats(path, by_model=[])
    if not os.path.exists(path):
        return found
    found.bytes = sum(os.path.getsize(p) for p in _files(path) if os.path.exists(p))
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_SECONDS)
    except sqlite3.Error as e:
        raise StoreUnusable(str(e)) from e
    try:
        found.entries, found.oldest, found.newest = conn.execute(
            "SELECT COUNT(*), MIN(created), MAX(created) FROM entries"
        ).fetchone()
        if expiry is not None:
            found.expired = conn.execute(
                "SELECT COUNT(*) FROM entries WHERE created < ?", (time.time() - expiry,)
            ).fetchone()[0]
        found.by_model = conn.execute(
            "SELECT model, COUNT(*) FROM entries GROUP BY model ORDER BY COUNT(*) DESC, model"
        ).fetchall()
    except sqlite3.Error as e:
        raise StoreUnusable(f"not a model-call cache ({e})") from e
    finally:
        conn.close()
    return found


def clear(directory: str) -> int:
    """Remove every entry (the number removed); a file that is not a store is removed whole (-1)."""
    path = os.path.join(directory, FILE)
    if not os.path.exists(path):
        return 0
    try:
        conn = sqlite3.connect(path, timeout=BUSY_SECONDS, isolation_level=None)
        try:
            _ready(conn)
            removed = conn.execute("DELETE FROM entries").rowcount
            conn.execute("VACUUM")  # give the space back; other processes may go on using the file meanwhile
        finally:
            conn.close()
        return removed
    except (sqlite3.DatabaseError, StoreUnusable):
        for p in _files(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        return -1


def _files(path: str) -> tuple[str, ...]:
    return path, f"{path}-wal", f"{path}-shm"
