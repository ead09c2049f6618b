"""What the request path needs of its state: originals, compression decisions, injections,
and of each session when it was last seen, its last agent request and its project.

Each protocol has an embedded implementation (SQLite: ``memory/ccr.py``, ``memory/memo.py``,
``memory/injection_memo.py``; in process: ``memory/in_process.py``); a shared backend for several
replicas implements the same methods. Every implementation raises
``memory.state.StateUnavailable`` (or its subclass ``StateConflict``) for any failure of its
backend, never the backend's own error type.

Memos are versioned: a session's decision memo records how many times it was saved, and a
save that finds a newer version than it loaded raises ``StateConflict`` and drops the live
copy, so the next load reads what the other writer decided. An injection is written once per
session and anchor; a second writer's attempt keeps the first one's text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from compressors.pipeline import Decision, SessionMemo
from compressors.view import Dialect
from memory.injection_memo import Injected, SessionInjections


class Originals(Protocol):
    """Every original a marker leaves out, by its key (DESIGN.md, section 4)."""

    read_error: str | None  # why the last read failed; None when it worked
    retention_seconds: float  # how long an original outlives the last request that used it

    def put_many(self, originals: Mapping[str, str]) -> int:
        """Store (or refresh) these originals durably, all or none; how many were written."""

    def get(self, raw_key: str) -> bytes | None:
        """The original's exact bytes; None when the key is unknown or expired."""

    def purge_expired(self) -> int:
        """Forget originals past their retention; how many went."""


class DecisionMemos(Protocol):
    """Each session's compression decisions, so a message is sent the same way every time."""

    def load(self, session_id: str) -> SessionMemo:
        """The session's memo (an empty one for a new session)."""

    def save(self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]) -> None:
        """Persist the memo's state and its changed decisions at once; ``StateConflict`` when
        another writer saved the session since this memo was loaded."""

    def save_later(
        self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]
    ) -> None:
        """``save``, which the store may write with the next ``flush`` (or at once): for
        decisions no marker's original depends on. A later ``load`` gives them either way."""

    def flush(self) -> None:
        """Write the saves that wait (``save_later``); ``StateUnavailable`` if it fails."""

    def forget_live(self, session_id: str) -> None:
        """Drop any in-process copy: the next load reads what was saved."""

    def prune(self) -> int:
        """Forget the least recently used sessions beyond the store's limit; how many."""


class InjectionMemos(Protocol):
    """What memory injected into each session, re-sent byte for byte on every request."""

    def load(self, session_id: str) -> SessionInjections:
        """The session's injections so far."""

    def set_stable(self, session_id: str, text: str) -> None:
        """Record the session's stable block (the first writer's stays)."""

    def add(self, session_id: str, anchor: str, injected: Injected) -> None:
        """Record what the user message ``anchor`` received (the first writer's stays)."""

    def forget_live(self, session_id: str) -> None:
        """Drop any in-process copy: the next load reads what was saved."""

    def prune(self, max_age_days: float) -> int:
        """Forget the sessions not seen for ``max_age_days``; how many."""


class RequestClock(Protocol):
    """When each session sent its previous chat request."""

    def seen(self, session_id: str, now: float) -> float | None:
        """Record a request of the session at ``now`` (seconds since the epoch); the time of
        its previous one, or None for the first one seen."""


class Histories(Protocol):
    """Each session's last agent request, from which a compaction's checkpoint is built."""

    def remember(self, session_id: str, dialect: Dialect, raw: bytes) -> None:
        """Keep this body as the session's last (it may be kept after this returns; failing
        to keep it only makes a later checkpoint fall back to the compaction's transcript)."""

    def get(self, session_id: str) -> tuple[Dialect, bytes] | None:
        """The session's last agent request kept, if any."""


class ProjectActivity(Protocol):
    """Which project each session works in, and which projects were active lately."""

    def note(self, session_id: str, project: str, now: float) -> None:
        """The session's request named ``project`` (an absolute path) at ``now``."""

    def project_of(self, session_id: str) -> str | None:
        """The project the session's requests last named."""

    def active_since(self, since: float) -> list[str]:
        """The projects some session named at or after ``since``, sorted."""


class StatisticsBoard(Protocol):
    """Where replicas that share a state backend leave their statistics for each other: each
    publishes a snapshot of its own now and then, and any of them reads every live one."""

    def publish(self, replica: str, snapshot: bytes, ttl_seconds: int) -> None:
        """Leave ``snapshot`` as ``replica``'s, in place of its previous one; it disappears
        after ``ttl_seconds`` unless published again."""

    def snapshots(self) -> dict[str, bytes]:
        """Every replica's latest snapshot not yet expired, by replica name."""
