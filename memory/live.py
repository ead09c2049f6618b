"""The in-process copies of sessions' state that a store keeps for its warm loads."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Generic, TypeVar

from cachetools import LRUCache

T = TypeVar("T")


class LiveCopies(Generic[T]):
    """At most ``max_bytes`` of copies (as ``size`` measures them), the least recently used
    dropped first. Not locked: the store that owns it holds its own lock around each call."""

    def __init__(self, max_bytes: int, size: Callable[[T], int]) -> None:
        # Each copy beside its size, measured once when it is kept: a size may take a walk
        # over the whole copy, and the cache asks again on every insertion.
        self._copies: LRUCache[str, tuple[T, int]] = LRUCache(
            maxsize=max_bytes, getsizeof=itemgetter(1)
        )
        self._size = size

    def get(self, session_id: str) -> T | None:
        kept = self._copies.get(session_id)
        return None if kept is None else kept[0]

    def keep(self, session_id: str, copy: T) -> None:
        """(Re-)insert a copy, so the cache accounts for what it holds now; one larger than
        the whole cache is not kept."""
        size = self._size(copy)
        if size <= self._copies.maxsize:
            self._copies[session_id] = (copy, size)
        else:
            self._copies.pop(session_id, None)

    def grow(self, session_id: str, copy: T, added: int) -> None:
        """``keep``, for a copy kept already that has grown by about ``added`` (an estimate
        no lower than what it added): counted without measuring the whole copy again."""
        kept = self._copies.get(session_id)
        if kept is None or kept[0] is not copy:
            self.keep(session_id, copy)
        elif kept[1] + added <= self._copies.maxsize:
            self._copies[session_id] = (copy, kept[1] + added)
        else:
            self._copies.pop(session_id, None)

    def drop(self, session_id: str) -> None:
        self._copies.pop(session_id, None)

    @property
    def bytes(self) -> int:
        return int(self._copies.currsize)

    @property
    def max_bytes(self) -> int:
        return int(self._copies.maxsize)
