"""When each session sent its previous chat request: the in-process ``RequestClock``.

The compression addon treats a session idle for longer than a provider keeps its prompt cache
as cold (its bytes may be re-compressed freely). Processes that serve one session in turn must
agree on that, or they would send one message in two forms; a shared backend implements the
same protocol for them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

CAPACITY = 10_000  # sessions remembered; the least recently seen go first


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
