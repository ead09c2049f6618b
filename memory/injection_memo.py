"""What was injected into each session, kept so every later request re-sends the same bytes.

One row per session and anchor: ``system`` for the stable block, and the anchor of each user
message that received recalled hits or nudges (an empty text records "nothing was added", so
the search is not run again for that message). Durable in the state database, so a restart
of the proxy does not change what an old message looks like.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field

from memory.db import exclusive, state_errors, write_transaction
from memory.live import LiveCopies

SYSTEM_ANCHOR = "system"
LIVE_BYTES = 4 * 1024 * 1024  # in-process injections, by their text

SCHEMA = """
CREATE TABLE IF NOT EXISTS injection (
    session TEXT NOT NULL,
    anchor TEXT NOT NULL,
    turn INTEGER NOT NULL,
    nudges TEXT NOT NULL,
    text TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (session, anchor)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS injection_created ON injection (created);
"""


@dataclass(frozen=True, slots=True)
class Injected:
    text: str
    turn: int  # the how-many-th user message of the session we saw (0-based)
    # What it carries, for later turns to see: nudge kinds ("memory", "pressure"), the
    # checkpoint it resumed ("resume:<stamp>"). Stored in the table's ``nudges`` column.
    tags: tuple[str, ...] = ()


@dataclass(slots=True)
class SessionInjections:
    stable: str | None = None  # None: not decided yet for this session
    by_anchor: dict[str, Injected] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.by_anchor)

    def last_turn_tagged(self, tag: str) -> int | None:
        """The latest turn whose injection carries ``tag``; None when none does."""
        turns = [i.turn for i in self.by_anchor.values() if tag in i.tags]
        return max(turns) if turns else None

    def tagged(self, tag: str) -> bool:
        return any(tag in i.tags for i in self.by_anchor.values())

    def size(self) -> int:
        """Roughly what it holds in memory: its texts and anchors."""
        texts = sum(128 + len(anchor) + len(i.text) for anchor, i in self.by_anchor.items())
        return 256 + len(self.stable or "") + texts


class InjectionMemo:
    """Per-session injections: an LRU of live sessions (at most ``live_bytes``) over SQLite.
    Safe to share between threads."""

    def __init__(self, db: sqlite3.Connection, live_bytes: int = LIVE_BYTES) -> None:
        self.db = db
        self._live: LiveCopies[SessionInjections] = LiveCopies(live_bytes, SessionInjections.size)
        with state_errors("cannot create the injection table"):
            db.executescript(SCHEMA)

    def load(self, session_id: str) -> SessionInjections:
        with exclusive(self.db):
            memo = self._live.get(session_id)
            if memo is not None:
                return memo
            memo = SessionInjections()
            with state_errors("cannot read the state database"):
                rows = self.db.execute(
                    "SELECT anchor, turn, nudges, text FROM injection WHERE session = ?",
                    (session_id,),
                ).fetchall()
            for anchor, turn, nudges, text in rows:
                if anchor == SYSTEM_ANCHOR:
                    memo.stable = text
                else:
                    memo.by_anchor[anchor] = Injected(
                        text, turn, tuple(filter(None, nudges.split(",")))
                    )
            self._live.keep(session_id, memo)
            return memo

    def set_stable(self, session_id: str, text: str) -> None:
        with exclusive(self.db):
            stored = self._insert(session_id, SYSTEM_ANCHOR, Injected(text, -1))
            memo = self.load(session_id)
            memo.stable = stored.text
            self._live.keep(session_id, memo)

    def add(self, session_id: str, anchor: str, injected: Injected) -> None:
        with exclusive(self.db):
            stored = self._insert(session_id, anchor, injected)
            memo = self.load(session_id)
            memo.by_anchor[anchor] = stored
            self._live.keep(session_id, memo)

    @property
    def live_bytes(self) -> int:
        return self._live.bytes

    def _insert(self, session_id: str, anchor: str, injected: Injected) -> Injected:
        """Write the row unless one exists, and return what the row holds: a second process
        that decided first wins, here at once and on every later load; a row is never
        rewritten."""
        with state_errors("cannot write the state database"):
            inserted = self.db.execute(
                "INSERT OR IGNORE INTO injection VALUES (?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    anchor,
                    injected.turn,
                    ",".join(injected.tags),
                    injected.text,
                    time.time(),
                ),
            )
            if inserted.rowcount:
                return injected
            row = self.db.execute(
                "SELECT turn, nudges, text FROM injection WHERE session = ? AND anchor = ?",
                (session_id, anchor),
            ).fetchone()
        if row is None:  # pruned meanwhile: what this process decided is all there is
            return injected
        turn, nudges, text = row
        return Injected(text, turn, tuple(filter(None, nudges.split(","))))

    def forget_live(self, session_id: str) -> None:
        with exclusive(self.db):
            self._live.drop(session_id)

    def prune(self, max_age_days: float) -> int:
        """Forget the injections of sessions not seen for ``max_age_days``."""
        cutoff = time.time() - max_age_days * 86400
        with state_errors("cannot prune old injections"), write_transaction(self.db):
            stale = [
                row[0]
                for row in self.db.execute(
                    "SELECT session FROM injection GROUP BY session HAVING MAX(created) < ?",
                    (cutoff,),
                )
            ]
            for session_id in stale:
                self.db.execute("DELETE FROM injection WHERE session = ?", (session_id,))
                self._live.drop(session_id)
            return len(stale)
