"""CCR: every original that a marker leaves out, kept by key so it can be expanded again.

An in-process TTL cache sits in front of SQLite. Originals live for ``retention_days`` after
the last request that referenced them; each live marker refreshes its original at most once
per cache period, so a long session never loses what it still points at. A key enters the
cache only once its original is committed: a cached key is a durable one.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Mapping

from cachetools import TTLCache

from compressors.markers import normalize_key, utf8
from memory.db import after_commit, exclusive, state_errors, write_transaction
from memory.state import StateUnavailable

CACHE_BYTES = 16 * 1024 * 1024  # originals held in process, by size
STORED_KEYS = 200_000  # original keys known to be stored, per process

SCHEMA = """
CREATE TABLE IF NOT EXISTS ccr_original (
    key TEXT PRIMARY KEY,
    content BLOB NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ccr_original_last_used ON ccr_original (last_used);
"""


class StoredKeys:
    """Keys of originals known to be stored, each until its refresh is due (``seconds`` after
    it was written): a store writes only the others. Every request hands over every original
    its markers name (which keeps them alive): before it goes upstream those its session's
    last request did not name, the others once its answer is out (``proxy.compression``), so
    this is a dict lookup per original. At most ``max_keys`` are held; past that the expired
    go, then all (each is written once more: a refresh). The caller serialises access."""

    def __init__(self, seconds: float, max_keys: int = STORED_KEYS) -> None:
        self.seconds, self.max_keys = seconds, max_keys
        self._due: dict[str, float] = {}

    def unknown(self, originals: Mapping[str, str], now: float) -> list[tuple[str, str]]:
        """The originals to write: those whose keys are not known to be stored by ``now``."""
        due = self._due.get
        return [(key, text) for key, text in originals.items() if due(key, 0.0) <= now]

    def add(self, keys: Iterable[str], now: float) -> None:
        """``keys`` were committed at ``now``."""
        until = now + self.seconds
        stored = self._due
        for key in keys:
            stored[key] = until
        if len(stored) > self.max_keys:
            self._due = {key: due for key, due in stored.items() if due > now}
            if len(self._due) > self.max_keys:
                self._due = {}


class OriginalStore:
    def __init__(
        self,
        db: sqlite3.Connection,
        retention_days: float = 30.0,
        cache_bytes: int = CACHE_BYTES,
        cache_seconds: float = 600.0,
    ) -> None:
        self.db = db
        self.read_error: str | None = None  # why the last database read failed; None: it worked
        self.retention_seconds = retention_days * 86400.0
        # A cached key must still be in the database: the cache never outlives the retention.
        ttl = min(cache_seconds, self.retention_seconds / 2)
        self._cache: TTLCache[str, bytes] = TTLCache(maxsize=cache_bytes, ttl=ttl, getsizeof=len)
        self._stored = StoredKeys(ttl)
        with state_errors("cannot create the originals table"):
            db.executescript(SCHEMA)

    def put_many(self, originals: Mapping[str, str]) -> int:
        """Store or refresh originals in one transaction; returns how many were written.

        Raises ``StateUnavailable`` when the write fails: then none of them is kept, and no
        marker that names one may go upstream.
        """
        now = time.time()
        with exclusive(self.db):
            unknown = self._stored.unknown(originals, now)
            rows = [(key, utf8(text), now, now) for key, text in unknown]
            if not rows:
                return 0
            with state_errors("cannot write the state database"), write_transaction(self.db):
                self.db.executemany(
                    "INSERT INTO ccr_original (key, content, created, last_used) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET last_used = "
                    "excluded.last_used",
                    rows,
                )
                after_commit(self.db, lambda: self._remember(rows))
        return len(rows)

    def _remember(self, rows: list[tuple[str, bytes, float, float]]) -> None:
        """Know committed originals as stored (never before), and cache them for ``get``."""
        with exclusive(self.db):
            self._stored.add([key for key, _, _, _ in rows], rows[0][2])
            for key, content, _, _ in rows:
                if len(content) <= self._cache.maxsize:
                    self._cache[key] = content

    def get(self, raw_key: str) -> bytes | None:
        """The original's exact bytes, or None when the key is unknown or expired; raises
        ``StateUnavailable`` when the database cannot be read."""
        key = normalize_key(raw_key)
        if key is None:
            return None
        with exclusive(self.db):
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        try:
            with state_errors("cannot read the state database"):
                row = self.db.execute(
                    "SELECT content FROM ccr_original WHERE key = ? AND last_used >= ?",
                    (key, time.time() - self.retention_seconds),
                ).fetchone()
        except StateUnavailable as exc:
            self.read_error = str(exc)
            raise
        self.read_error = None
        return bytes(row[0]) if row else None

    def purge_expired(self) -> int:
        with state_errors("cannot purge expired originals"):
            cursor = self.db.execute(
                "DELETE FROM ccr_original WHERE last_used < ?",
                (time.time() - self.retention_seconds,),
            )
        return cursor.rowcount

    @property
    def cache_bytes(self) -> int:
        return int(self._cache.currsize)

    def __len__(self) -> int:
        with state_errors("cannot read the state database"):
            return int(self.db.execute("SELECT count(*) FROM ccr_original").fetchone()[0])
