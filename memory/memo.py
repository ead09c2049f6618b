"""Per-session memo of compression decisions, durable so a restart does not change bytes."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from operator import attrgetter

from compressors.pipeline import Decision, SessionMemo
from memory.db import after_commit, exclusive, state_errors, write_transaction
from memory.live import LiveCopies
from memory.state import StateConflict

LIVE_BYTES = 8 * 1024 * 1024  # in-process memos, by their decisions' text
_text = attrgetter("text")


def memo_size(memo: SessionMemo) -> int:
    """Roughly what a memo holds: its decisions' fingerprints and texts, the keys of their
    originals, and the contents of the markers it sent."""
    decisions = memo.decisions
    texts = sum(map(len, filter(None, map(_text, decisions.values()))))
    fingerprints = 64 * len(decisions) + sum(map(len, decisions))
    keys = 64 * len(memo.original_keys) + sum(map(len, memo.original_keys))
    markers = sum(map(len, memo.sent_as)) + sum(map(len, memo.sent_as.values()))
    return 256 + fingerprints + texts + keys + markers


SCHEMA = """
CREATE TABLE IF NOT EXISTS memo_session (
    session TEXT PRIMARY KEY,
    level INTEGER NOT NULL,
    thresholds_crossed INTEGER NOT NULL,
    turn TEXT,
    events INTEGER NOT NULL,
    updated REAL NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
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
    """``DecisionMemos`` on SQLite: an LRU of live memos (at most ``live_bytes``) over the
    database; at most ``max_sessions`` kept. Safe to share between threads (one session's
    requests must still come one at a time: its memo object is changed outside the lock).
    Several processes may share the database: each save checks the session's version."""

    def __init__(
        self, db: sqlite3.Connection, max_sessions: int = 2000, live_bytes: int = LIVE_BYTES
    ) -> None:
        self.db = db
        self.max_sessions = max_sessions
        self._live: LiveCopies[SessionMemo] = LiveCopies(live_bytes, memo_size)
        self._saves = 0
        with state_errors("cannot create the memo tables"):
            db.executescript(SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(memo_session)")}
            if "version" not in columns:  # a database written before memos had versions
                db.execute("ALTER TABLE memo_session ADD COLUMN version INTEGER NOT NULL DEFAULT 0")

    def load(self, session_id: str) -> SessionMemo:
        with exclusive(self.db):
            memo = self._live.get(session_id)
            if memo is not None:
                return memo
            memo = SessionMemo()
            with state_errors("cannot read the state database"):
                row = self.db.execute(
                    "SELECT level, thresholds_crossed, turn, events, version FROM memo_session "
                    "WHERE session = ?",
                    (session_id,),
                ).fetchone()
                if row is not None:
                    memo.level, memo.thresholds_crossed, memo.turn, memo.events = row[:4]
                    memo.version = row[4]
                    for fp, level, text, final in self.db.execute(
                        "SELECT fp, level, text, final FROM memo_decision WHERE session = ?",
                        (session_id,),
                    ):
                        memo.decisions[fp] = Decision(level=level, text=text, final=bool(final))
            self._live.keep(session_id, memo)
            return memo

    def forget_live(self, session_id: str) -> None:
        """Drop the in-process copy; the next ``load`` reads what was really saved."""
        with exclusive(self.db):
            self._live.drop(session_id)

    def save(self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]) -> None:
        """Persist the session's state and its changed decisions in one transaction; raises
        ``StateUnavailable`` (nothing saved) when the write fails, and ``StateConflict`` (the
        live copy dropped) when another process saved the session since ``memo`` was read."""
        with exclusive(self.db):
            try:
                with state_errors("cannot write the state database"), write_transaction(self.db):
                    self._write_session(session_id, memo)
                    if changed:
                        self.db.executemany(
                            "INSERT OR REPLACE INTO memo_decision VALUES (?, ?, ?, ?, ?)",
                            [
                                (session_id, fp, d.level, d.text, int(d.final))
                                for fp, d in changed.items()
                            ],
                        )
                    after_commit(self.db, lambda: self._saved(session_id, memo))
            except StateConflict:
                self._live.drop(session_id)
                raise

    def _saved(self, session_id: str, memo: SessionMemo) -> None:
        """Once the session's rows are committed: the live copy is what was saved."""
        memo.version += 1
        self._live.keep(session_id, memo)
        self._saves += 1
        if self._saves % 100 == 0:
            self.prune()

    def _write_session(self, session_id: str, memo: SessionMemo) -> None:
        """The session's row, one version on from the one ``memo`` was read at."""
        state = (memo.level, memo.thresholds_crossed, memo.turn, memo.events, time.time())
        updated = self.db.execute(
            "UPDATE memo_session SET level = ?, thresholds_crossed = ?, turn = ?, events = ?, "
            "updated = ?, version = version + 1 WHERE session = ? AND version = ?",
            (*state, session_id, memo.version),
        )
        if updated.rowcount:
            return
        found = self.db.execute(
            "SELECT version FROM memo_session WHERE session = ?", (session_id,)
        ).fetchone()
        if found is not None:
            raise StateConflict(
                f"session {session_id}: its compression decisions were saved by another "
                f"process (version {found[0]}; this one read version {memo.version})"
            )
        self.db.execute(
            "INSERT INTO memo_session (level, thresholds_crossed, turn, events, updated, "
            "session, version) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*state, session_id, memo.version + 1),
        )

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
                self._live.drop(session_id)
            return len(stale)

    @property
    def live_bytes(self) -> int:
        return self._live.bytes
