"""Per-session memo of compression decisions, durable so a restart does not change bytes."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from operator import attrgetter

from compressors.pipeline import Decision, SessionMemo
from memory.db import after_commit, exclusive, state_errors, write_transaction
from memory.live import LiveCopies
from memory.state import StateConflict, StateUnavailable

log = logging.getLogger("deepmem.memo")
LIVE_BYTES = 8 * 1024 * 1024  # in-process memos, by their decisions' text
_text = attrgetter("text")


def decisions_size(decisions: Mapping[str, Decision]) -> int:
    """What ``decisions`` add to a memo's ``memo_size`` at most: each one's fingerprint and
    text, its original's key and the marker content its text may name."""
    return sum(
        224 + 2 * len(fp) + (len(decision.text) if decision.text is not None else 0)
        for fp, decision in decisions.items()
    )


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


@dataclass(slots=True)
class _Waiting:
    """A session's save that waits for ``MemoStore.flush``: its state and changed decisions as
    they were saved (the memo object goes on changing with the session's next request)."""

    memo: SessionMemo
    state: tuple[int, int, str | None, int]
    changed: dict[str, Decision]


def _state(memo: SessionMemo) -> tuple[int, int, str | None, int]:
    return memo.level, memo.thresholds_crossed, memo.turn, memo.events


class MemoStore:
    """``DecisionMemos`` on SQLite: an LRU of live memos (at most ``live_bytes``) over the
    database; at most ``max_sessions`` kept. Safe to share between threads (one session's
    requests must still come one at a time: its memo object is changed outside the lock).
    Several processes may share the database: each save checks the session's version (a save
    that waited for ``flush`` is checked then)."""

    def __init__(
        self, db: sqlite3.Connection, max_sessions: int = 2000, live_bytes: int = LIVE_BYTES
    ) -> None:
        self.db = db
        self.max_sessions = max_sessions
        self._live: LiveCopies[SessionMemo] = LiveCopies(live_bytes, memo_size)
        self._waiting: dict[str, _Waiting] = {}
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
            if session_id in self._waiting:  # its live copy went: what it waits to save first
                self._flush([session_id])
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
        """Drop the in-process copy; the next ``load`` reads what was really saved (first
        what an earlier request's save waits to write: that request went upstream)."""
        with exclusive(self.db):
            if session_id in self._waiting:
                try:
                    self._flush([session_id])
                except StateUnavailable as exc:
                    log.warning("session %s: decisions not saved: %s", session_id, exc)
            self._live.drop(session_id)

    def save(self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]) -> None:
        """Persist the session's state and its changed decisions (with what an earlier save
        of it waits to write) in one transaction; raises ``StateUnavailable`` (nothing saved)
        when the write fails, and ``StateConflict`` (the live copy dropped) when another
        process saved the session since ``memo`` was read."""
        with exclusive(self.db):
            waiting = self._waiting.get(session_id)
            if waiting is not None and waiting.memo is memo:
                changed = {**waiting.changed, **changed}
            elif waiting is not None:
                self._flush([session_id])
            try:
                with state_errors("cannot write the state database"), write_transaction(self.db):
                    self._write_session(session_id, memo, _state(memo))
                    self._write_decisions(session_id, changed)
                    after_commit(self.db, lambda: self._saved(session_id, memo))
            except StateConflict:
                self._waiting.pop(session_id, None)
                self._live.drop(session_id)
                raise

    def save_later(
        self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]
    ) -> None:
        """``save``, written by the next ``flush`` (or the session's next save or load that
        misses its live copy): for decisions that no marker's original depends on, off the
        request's path. The session's requests meanwhile use the live copy, which has them;
        a process that dies before the flush loses them (its next request decides again)."""
        with exclusive(self.db):
            waiting = self._waiting.get(session_id)
            if waiting is not None and waiting.memo is memo:
                waiting.state = _state(memo)
                waiting.changed.update(changed)
            else:
                if waiting is not None:
                    self._flush([session_id])
                self._waiting[session_id] = _Waiting(memo, _state(memo), dict(changed))
            # Measured here, on the thread changing it: by what the request added.
            self._live.grow(session_id, memo, decisions_size(changed))

    def flush(self) -> None:
        """Write every save that waits, in one transaction; a session another process saved
        meanwhile loses its live copy (its next request decides on what that one saved).
        Raises ``StateUnavailable`` (the saves wait on) when the write fails."""
        with exclusive(self.db):
            self._flush(list(self._waiting))

    def _flush(self, sessions: list[str]) -> None:
        if not sessions:
            return
        written: list[tuple[str, _Waiting]] = []
        with state_errors("cannot write the state database"), write_transaction(self.db):
            for session_id in sessions:
                waiting = self._waiting[session_id]
                try:
                    self._write_session(session_id, waiting.memo, waiting.state)
                except StateConflict as exc:
                    log.info("%s; its next request decides again", exc)
                    del self._waiting[session_id]
                    self._live.drop(session_id)
                    continue
                self._write_decisions(session_id, waiting.changed)
                written.append((session_id, waiting))
            after_commit(self.db, lambda: self._flushed(written))

    def _flushed(self, written: list[tuple[str, _Waiting]]) -> None:
        """Once the waiting saves are committed. The memos stay live as they are: they may be
        changing on another thread, for the session's next request."""
        for session_id, waiting in written:
            waiting.memo.version += 1
            if self._waiting.get(session_id) is waiting:
                del self._waiting[session_id]
            self._counted()

    def _saved(self, session_id: str, memo: SessionMemo) -> None:
        """Once the session's rows are committed: the live copy is what was saved (with
        what its earlier saves waited to write)."""
        memo.version += 1
        self._waiting.pop(session_id, None)
        self._live.keep(session_id, memo)
        self._counted()

    def _counted(self) -> None:
        self._saves += 1
        if self._saves % 100 == 0:
            self.prune()

    def _write_decisions(self, session_id: str, changed: Mapping[str, Decision]) -> None:
        if changed:
            self.db.executemany(
                "INSERT OR REPLACE INTO memo_decision VALUES (?, ?, ?, ?, ?)",
                [(session_id, fp, d.level, d.text, int(d.final)) for fp, d in changed.items()],
            )

    def _write_session(
        self, session_id: str, memo: SessionMemo, saved: tuple[int, int, str | None, int]
    ) -> None:
        """The session's row (``saved``: its level, thresholds crossed, turn and events), one
        version on from the one ``memo`` was read at."""
        state = (*saved, time.time())
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
        """Forget the least recently updated sessions beyond ``max_sessions`` (not one whose
        save waits: it is in use)."""
        with state_errors("cannot prune old session memos"), write_transaction(self.db):
            stale = [
                row[0]
                for row in self.db.execute(
                    "SELECT session FROM memo_session ORDER BY updated DESC LIMIT -1 OFFSET ?",
                    (self.max_sessions,),
                )
                if row[0] not in self._waiting
            ]
            for session_id in stale:
                self.db.execute("DELETE FROM memo_decision WHERE session = ?", (session_id,))
                self.db.execute("DELETE FROM memo_session WHERE session = ?", (session_id,))
                self._live.drop(session_id)
            return len(stale)

    @property
    def live_bytes(self) -> int:
        return self._live.bytes
