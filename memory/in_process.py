"""The session-state protocols of ``memory/interfaces.py`` in one process: when each session
was last seen (``LocalClock``), each session's last agent request (``LocalHistories``) and
which project each session works in (``LocalActivity``).

One process needs nothing more. Processes that serve one session in turn must share these
(``memory/redis_state.py``): the compression addon treats a session idle for longer than a
provider keeps its prompt cache as cold, a compaction's checkpoint is built from the session's
last agent request, and a compaction request (which names no working directory) belongs to the
project its session last named.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from cachetools import LRUCache

from compressors.view import Dialect

CAPACITY = 10_000  # sessions remembered; the least recently seen go first
HISTORY_SESSIONS = 128
HISTORY_BYTES = 64 * 1024 * 1024


class LocalClock:
    """``RequestClock`` for one process. Safe to share between threads."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def seen(self, session_id: str, now: float) -> float | None:
        with self._lock:
            previous = self._seen.pop(session_id, None)
            self._seen[session_id] = now
            if len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        return previous


class LocalHistories:
    """``Histories`` for one process: the last agent request body of each session, bounded
    in sessions and bytes. Safe to share between threads."""

    def __init__(
        self, max_sessions: int = HISTORY_SESSIONS, max_bytes: int = HISTORY_BYTES
    ) -> None:
        self._bodies: LRUCache[str, tuple[Dialect, bytes]] = LRUCache(
            maxsize=max_bytes, getsizeof=lambda entry: len(entry[1]) or 1
        )
        self._max_sessions = max_sessions
        self._lock = threading.Lock()

    def remember(self, session_id: str, dialect: Dialect, raw: bytes) -> None:
        with self._lock:
            if len(raw) > self._bodies.maxsize:
                # Too large to keep: a compaction then falls back to its own transcript,
                # never to an older body of the session.
                self._bodies.pop(session_id, None)
                return
            self._bodies[session_id] = (dialect, raw)
            while len(self._bodies) > self._max_sessions:
                self._bodies.popitem()

    def get(self, session_id: str) -> tuple[Dialect, bytes] | None:
        with self._lock:
            return self._bodies.get(session_id)

    @property
    def bytes(self) -> int:
        return int(self._bodies.currsize)


class LocalActivity:
    """``ProjectActivity`` for one process. Safe to share between threads."""

    def __init__(self, capacity: int = 4096) -> None:
        self._projects: dict[str, float] = {}
        self._sessions: LRUCache[str, str] = LRUCache(maxsize=capacity)
        self._lock = threading.Lock()

    def note(self, session_id: str, project: str, now: float) -> None:
        with self._lock:
            self._projects[project] = now
            self._sessions[session_id] = project

    def project_of(self, session_id: str) -> str | None:
        with self._lock:
            return self._sessions.get(session_id)

    def active_since(self, since: float) -> list[str]:
        with self._lock:
            return sorted(path for path, seen in self._projects.items() if seen >= since)
