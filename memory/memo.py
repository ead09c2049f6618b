"""Per-session memo of compression decisions, durable so a restart does not change bytes."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping

from cachetools import LRUCache

from compressors.pipeline import Decision, SessionMemo
from memory.db import exclusive, state_errors, write_transaction

LIVE_BYTES = 8 * 1024 * 1024  # in-process memos, by their decisions' text


def memo_size(memo: SessionMemo) -> int:
    """Roughly what a memo holds: its decisions' fingerprints and texts, and the contents of
    the markers it sent."""
    decisions = sum(64 + len(fp) + len(d.text or "") for fp, d in memo.decisions.items())
    return 256 + decisions + sum(len(key) + len(text) for key, text in memo.sent_as.items())


SCHEMA = """
CREATE TABLE IF NOT EXISTS memo_session (
    session TEXT PRIMARY KEY,
    level INTEGER NOT NULL,
    thresholds_crossed INTEGER NOT NULL,
    turn TEXT,
    events INTEGER NOT NULL,
    updated REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS memo_session_updated ON memo_session (updated);
CREATE TABLE IF NOT EXISTS memo_decision (
    session TEXT NOT NULL,
    fp TEXT NOT NULL,
    level INTEGER NOT NULL,
    text TEXT,
    final INTEGER NOT NULL,
    PRIMARY KEY (session, fp)
) WITHOUT ROWID;
"""


class MemoStore:
    """Memos by session: an LRU of live ones (at most ``live_bytes``) over SQLite; at most
    ``max_sessions`` kept. Safe to share between threads (one session's requests must still
    come one at a time: its memo object is changed outside the lock)."""

    def __init__(
        self, db: sqlite3.Connection, max_sessions: int = 2000, live_bytes: int = LIVE_BYTES
    ) -> None:
        self.db = db
        self.max_sessions = max_sessions
        self._live: LRUCache[str, SessionMemo] = LRUCache(maxsize=live_bytes, getsizeof=memo_size)
        self._saves = 0
        with state_errors("cannot create the memo tables"):
            db.executescript(SCHEMA)

    def load(self, session_id: str) -> SessionMemo:
        with exclusive(self.db):
            memo = self._live.get(session_id)
            if memo is not None:
                return memo
            memo = SessionMemo()
            with state_errors("cannot read the state database"):
                row = self.db.execute(
                    "SELECT level, thresholds_crossed, turn, events FROM memo_session "
                    "WHERE session = ?",
                    (session_id,),
                ).fetchone()
                if row is not None:
                    memo.level, memo.thresholds_crossed, memo.turn, memo.events = row
                    for fp, level, text, final in self.db.execute(
                        "SELECT fp, level, text, final FROM memo_decision WHERE session = ?",
                        (session_id,),
                    ):
                        memo.decisions[fp] = Decision(level=level, text=text, final=bool(final))
            self._keep(session_id, memo)
            return memo

    def forget_live(self, session_id: str) -> None:
        """Drop the in-process copy; the next ``load`` reads what was really saved."""
        with exclusive(self.db):
            self._live.pop(session_id, None)

    def save(self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]) -> None:
        """Persist the session's state and its changed decisions in one transaction; raises
        ``StateUnavailable`` (nothing saved) when the write fails."""
        with exclusive(self.db):
            with state_errors("cannot write the state database"), write_transaction(self.db):
                self.db.execute(
                    "INSERT INTO memo_session VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session) DO "
                    "UPDATE SET level = excluded.level, thresholds_crossed = "
                    "excluded.thresholds_crossed, turn = excluded.turn, events = excluded.events, "
                    "updated = excluded.updated",
                    (
                        session_id,
                        memo.level,
                        memo.thresholds_crossed,
                        memo.turn,
                        memo.events,
                        time.time(),
                    ),
                )
                if changed:
                    self.db.executemany(
                        "INSERT OR REPLACE INTO memo_decision VALUES (?, ?, ?, ?, ?)",
                        [
                            (session_id, fp, d.level, d.text, int(d.final))
                            for fp, d in changed.items()
                        ],
                    )
            self._keep(session_id, memo)
            self._saves += 1
            if self._saves % 100 == 0:
                self.prune()

    def prune(self) -> int:
        """Forget the least recently updated sessions beyond ``max_sessions``."""
        with state_errors("cannot prune old session memos"), write_transaction(self.db):
            stale = [
                row[0]
                for row in self.db.execute(
                    "SELECT session FROM memo_session ORDER BY updated DESC LIMIT -1 OFFSET ?",
                    (self.max_sessions,),
                )
            ]
            for session_id in stale:
                self.db.execute("DELETE FROM memo_decision WHERE session = ?", (session_id,))
                self.db.execute("DELETE FROM memo_session WHERE session = ?", (session_id,))
                self._live.pop(session_id, None)
            return len(stale)

    def _keep(self, session_id: str, memo: SessionMemo) -> None:
        """(Re-)insert a live memo, so the cache accounts for what it holds now."""
        if memo_size(memo) <= self._live.maxsize:
            self._live[session_id] = memo
        else:
            self._live.pop(session_id, None)

    @property
    def live_bytes(self) -> int:
        return int(self._live.currsize)
