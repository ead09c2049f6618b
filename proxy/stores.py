"""The state database the request path keeps: originals, compression memos, injection memos."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from memory.ccr import OriginalStore
from memory.clock import LocalClock
from memory.db import DB_NAME, open_database
from memory.injection_memo import InjectionMemo
from memory.interfaces import DecisionMemos, InjectionMemos, Originals, RequestClock
from memory.memo import MemoStore
from memory.state import StateUnavailable
from proxy.config import Settings
from proxy.health import Health

STATE_DB = "state_db"  # the /health component: the state database cannot be opened


@dataclass
class Stores:
    """What the proxy keeps in its state database."""

    originals: Originals
    memos: DecisionMemos
    injections: InjectionMemos
    unavailable: str | None = None  # why there is no durable store: then nothing is rewritten
    retention_days: float = 30.0
    clock: RequestClock = field(default_factory=LocalClock)

    def housekeeping(self) -> tuple[int, int]:
        """Forget expired originals, and the memos of sessions not seen within the retention:
        how many originals and how many sessions' memos. Blocking: run it on a worker thread."""
        purged = self.originals.purge_expired()
        pruned = self.memos.prune() + self.injections.prune(self.retention_days)
        return purged, pruned


class NoOriginals(OriginalStore):
    """The originals while no durable store could be opened: nothing is kept, so nothing may
    be compressed, and every expand answers why."""

    def __init__(self, reason: str) -> None:
        super().__init__(open_database(None))
        self.reason = reason

    def put_many(self, originals: Mapping[str, str]) -> int:
        raise StateUnavailable(self.reason)

    def get(self, raw_key: str) -> bytes | None:
        raise StateUnavailable(self.reason)


def state_db_path(settings: Settings) -> Path:
    return settings.data_dir / DB_NAME


def open_originals(settings: Settings) -> Originals:
    """The originals alone, for a process that only reads them (``deepmem expand``).
    Raises ``StateUnavailable`` when the state database cannot be opened."""
    return OriginalStore(open_database(state_db_path(settings)), settings.retention_days)


def open_stores(settings: Settings, *, in_memory: bool = False) -> Stores:
    """The stores on the data dir's database (``in_memory``: a private one, for replay).
    Raises ``StateUnavailable`` when it cannot be opened, read or written."""
    db = open_database(None if in_memory else state_db_path(settings))
    try:
        originals = OriginalStore(db, retention_days=settings.retention_days)
        originals.purge_expired()
        return Stores(
            originals, MemoStore(db), InjectionMemo(db), retention_days=settings.retention_days
        )
    except StateUnavailable:
        db.close()
        raise


def open_durable_stores(settings: Settings, health: Health) -> Stores:
    """The stores on the data dir's database; when it cannot be used, stores that keep no
    originals, with the reason reported in ``health`` (and logged as an error). Without a
    durable store the proxy relays every request unchanged (DESIGN.md section 3, invariant 5)."""
    try:
        stores = open_stores(settings)
    except StateUnavailable as exc:
        reason = (
            f"{exc}; relaying every request unchanged (no compression, no memory injection) "
            f"until the state database in {settings.data_dir} can be used"
        )
        health.report(STATE_DB, reason)
        db = open_database(None)  # the captures' per-session memo, lost at a restart
        return Stores(NoOriginals(reason), MemoStore(db), InjectionMemo(db), reason)
    return stores
