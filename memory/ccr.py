"""CCR: every original that a marker leaves out, kept by key so it can be expanded again.

An in-process TTL cache sits in front of SQLite. Originals live for ``retention_days`` after
the last request that referenced them; each live marker refreshes its original at most once
per cache period, so a long session never loses what it still points at.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping

from cachetools import TTLCache

from compressors.markers import normalize_key, utf8
from memory.db import exclusive

CACHE_BYTES = 16 * 1024 * 1024  # originals held in process, by size

SCHEMA = """
CREATE TABLE IF NOT EXISTS ccr_original (
    key TEXT PRIMARY KEY,
    content BLOB NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ccr_original_last_used ON ccr_original (last_used);
"""


class OriginalStore:
    def __init__(
        self,
        db: sqlite3.Connection,
        retention_days: float = 30.0,
        cache_bytes: int = CACHE_BYTES,
        cache_seconds: float = 600.0,
    ) -> None:
        self.db = db
        self.retention_seconds = retention_days * 86400.0
        self._cache: TTLCache[str, bytes] = TTLCache(
            maxsize=cache_bytes, ttl=cache_seconds, getsizeof=len
        )
        db.executescript(SCHEMA)

    def put_many(self, originals: Mapping[str, str]) -> int:
        """Store or refresh originals; returns how many were written to the database."""
        rows = []
        now = time.time()
        with exclusive(self.db):
            for key, text in originals.items():
                if key in self._cache:
                    continue
                content = utf8(text)
                if len(content) <= self._cache.maxsize:
                    self._cache[key] = content
                rows.append((key, content, now, now))
            if rows:
                self.db.executemany(
                    "INSERT INTO ccr_original (key, content, created, last_used) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (key) DO UPDATE SET last_used = "
                    "excluded.last_used",
                    rows,
                )
        return len(rows)

    def get(self, raw_key: str) -> bytes | None:
        """The original's exact bytes, or None when the key is unknown or expired."""
        key = normalize_key(raw_key)
        if key is None:
            return None
        with exclusive(self.db):
            cached = self._cache.get(key)
        if cached is not None:
            return cached
        row = self.db.execute(
            "SELECT content FROM ccr_original WHERE key = ? AND last_used >= ?",
            (key, time.time() - self.retention_seconds),
        ).fetchone()
        return bytes(row[0]) if row else None

    def purge_expired(self) -> int:
        cursor = self.db.execute(
            "DELETE FROM ccr_original WHERE last_used < ?",
            (time.time() - self.retention_seconds,),
        )
        return cursor.rowcount

    @property
    def cache_bytes(self) -> int:
        return int(self._cache.currsize)

    def __len__(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM ccr_original").fetchone()[0])
