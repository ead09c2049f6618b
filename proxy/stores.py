"""The state the request path keeps: originals, compression memos, injection memos, and of
each session when it was last seen, its last agent request and its project. SQLite in the data
directory by default; a Redis server that several replicas share when ``state_url`` names
one."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from memory.ccr import OriginalStore
from memory.db import DB_NAME, open_database, state_errors, write_transaction
from memory.in_process import LocalActivity, LocalClock, LocalHistories
from memory.injection_memo import InjectionMemo
from memory.interfaces import (
    DecisionMemos,
    Histories,
    InjectionMemos,
    Originals,
    ProjectActivity,
    RequestClock,
    StatisticsBoard,
)
from memory.memo import MemoStore
from memory.redis_state import (
    RedisActivity,
    RedisClock,
    RedisDecisionMemos,
    RedisHistories,
    RedisInjectionMemos,
    RedisOriginals,
    RedisState,
    RedisStatisticsBoard,
    redact_url,
)
from memory.state import StateUnavailable
from proxy.health import Health
from proxy.options import Option

if TYPE_CHECKING:
    from proxy.config import Settings

STATE_DB = "state_db"  # the /health component: the state database cannot be opened
STATE_SERVER = "state_server"  # the /health component: the shared state server is unwell
STATE_SCHEMES = ("redis://", "rediss://", "unix://")


def parse_state_url(raw: object) -> str | None:
    text = str(raw).strip()
    if not text:
        return None
    if not text.lower().startswith(STATE_SCHEMES):
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {redact_url(text)!r}")
    return text


OPTIONS: tuple[Option, ...] = (
    Option(
        "state_url",
        parse_state_url,
        None,
        "Where the request path's state lives (originals, compression decisions, injections, "
        "and of each session when it was last seen, its last request and its project). Unset: "
        "SQLite in the data directory. "
        "'redis://[:PASSWORD@]HOST[:PORT][/DB]' (rediss:// for TLS): a Redis server that "
        "several replicas share (see 'Running several replicas').",
        "URL",
    ),
)


@dataclass
class Stores:
    """The state the request path keeps, on one backend: SQLite (the session state in
    process), or a Redis server replicas share."""

    originals: Originals
    memos: DecisionMemos
    injections: InjectionMemos
    unavailable: str | None = None  # why there is no durable store: then nothing is rewritten
    retention_days: float = 30.0
    clock: RequestClock = field(default_factory=LocalClock)
    histories: Histories = field(default_factory=LocalHistories)
    activity: ProjectActivity = field(default_factory=LocalActivity)
    board: StatisticsBoard | None = None  # replicas' statistics: only on a shared backend
    backend: str = "sqlite"  # what /health shows: "sqlite" or the server's URL, no password
    check: Callable[[], str | None] = lambda: None  # what is wrong with the backend, if anything
    # One transaction around several writes of a request (the SQLite database's; a shared
    # server's writes are each atomic on their own).
    transaction: Callable[[], AbstractContextManager[object]] = nullcontext
    close: Callable[[], None] = lambda: None

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


def _transaction(db: sqlite3.Connection) -> AbstractContextManager[object]:
    """The database's writes inside commit together (``memory.db.write_transaction``)."""

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with state_errors("cannot write the state database"), write_transaction(db, lazy=True):
            yield

    return both()


def state_db_path(settings: Settings) -> Path:
    return settings.data_dir / DB_NAME


def open_originals(settings: Settings) -> Originals:
    """The originals alone, for a process that only reads them (``deepmem expand``).
    Raises ``StateUnavailable`` when the state cannot be opened."""
    if settings.state_url:
        return RedisOriginals(RedisState(settings.state_url), settings.retention_days)
    return OriginalStore(open_database(state_db_path(settings)), settings.retention_days)


def open_stores(settings: Settings, *, in_memory: bool = False) -> Stores:
    """The stores on the data dir's database (``in_memory``: a private one, for replay), or
    on the server ``state_url`` names. Raises ``StateUnavailable`` when the database cannot
    be opened, read or written, or the URL cannot be used (a server that does not answer yet
    is no reason: each call fails open until it does)."""
    if settings.state_url and not in_memory:
        return _redis_stores(settings.state_url, settings.retention_days)
    db = open_database(None if in_memory else state_db_path(settings))
    try:
        originals = OriginalStore(db, retention_days=settings.retention_days)
        originals.purge_expired()
        memos = MemoStore(db)
        return Stores(
            originals,
            memos,
            InjectionMemo(db),
            retention_days=settings.retention_days,
            transaction=partial(_transaction, db),
            close=memos.flush,
        )
    except StateUnavailable:
        db.close()
        raise


def _redis_stores(url: str, retention_days: float) -> Stores:
    state = RedisState(url)
    return Stores(
        RedisOriginals(state, retention_days),
        RedisDecisionMemos(state, retention_days),
        RedisInjectionMemos(state, retention_days),
        retention_days=retention_days,
        clock=RedisClock(state, retention_days),
        histories=RedisHistories(state),
        activity=RedisActivity(state, retention_days),
        board=RedisStatisticsBoard(state),
        backend=state.shown,
        check=state.check,
        close=state.close,
    )


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
