"""The SQLite database in the data dir that holds durable proxy state."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from memory.state import StateUnavailable
from memory.threads import NamedThread

DB_NAME = "deepmem.sqlite3"

# How long a statement waits for another process's write lock. Short: the request path fails
# open (forwards the original request) rather than stall a session on a busy database.
BUSY_TIMEOUT_SECONDS = 1.0
# The checkpoint thread copies the write-ahead log into the database file once no commit
# has come for CHECKPOINT_QUIET_SECONDS (an agent's steps are seconds apart: between two of
# them), or CHECKPOINT_BUSY_SECONDS after the last checkpoint while commits go on; it looks
# every CHECKPOINT_POLL_SECONDS and ends after CHECKPOINT_IDLE_SECONDS without a commit.
CHECKPOINT_QUIET_SECONDS = 0.25
CHECKPOINT_BUSY_SECONDS = 5.0
CHECKPOINT_POLL_SECONDS = 0.05
CHECKPOINT_IDLE_SECONDS = 5.0

log = logging.getLogger("deepmem.state")


class Checkpoints:
    """Copies the write-ahead log into the database file on a thread of its own.

    SQLite's automatic checkpoint runs inside the COMMIT that takes the log past 1,000 pages:
    with ``synchronous=NORMAL`` that commit also syncs the database file, 4-12 ms on a
    request's path for work no marker waits for. Commits ``nudge`` this instead (a time
    stamp: no thread is woken), and a thread checkpoints (PASSIVE: it never blocks a writer)
    when commits pause, between requests: the sync slows the commits of requests beside it.
    The thread ends when commits stop.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._last_commit = 0.0  # time.monotonic() of the newest nudge

    def nudge(self) -> None:
        """A transaction committed: checkpoint once commits pause."""
        self._last_commit = time.monotonic()
        with self._lock:
            if self._thread is None:
                self._thread = NamedThread(target=self._run, name="deepmem-wal", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            connection = sqlite3.connect(  # mode=rw: a database removed meanwhile stays gone
                f"{self._path.resolve().as_uri()}?mode=rw",
                timeout=BUSY_TIMEOUT_SECONDS,
                isolation_level=None,
                uri=True,
            )
        except sqlite3.Error as exc:
            log.warning("cannot checkpoint %s: %s", self._path, exc)
            with self._lock:
                self._thread = None
            return
        checkpointed, checkpointed_commit = time.monotonic(), 0.0
        try:
            while True:
                time.sleep(CHECKPOINT_POLL_SECONDS)
                now, last_commit = time.monotonic(), self._last_commit
                due = last_commit > checkpointed_commit and (
                    now - last_commit >= CHECKPOINT_QUIET_SECONDS
                    or now - checkpointed >= CHECKPOINT_BUSY_SECONDS
                )
                if due:
                    try:
                        connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    except sqlite3.Error as exc:
                        log.warning("cannot checkpoint %s: %s", self._path, exc)
                    checkpointed, checkpointed_commit = time.monotonic(), last_commit
                if now - last_commit >= CHECKPOINT_IDLE_SECONDS:
                    with self._lock:  # a nudge before this is seen here; one after starts anew
                        if time.monotonic() - self._last_commit >= CHECKPOINT_IDLE_SECONDS:
                            self._thread = None
                            return
        finally:
            connection.close()


class SerializedConnection(sqlite3.Connection):
    """A connection the proxy's worker threads share: one statement at a time, and a
    transaction (or a read and the in-process cache it fills) under ``exclusive``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.RLock()
        # While a write transaction is open (held by the thread holding ``lock``): the work
        # to do once it commits (``after_commit``).
        self.committing: list[Callable[[], None]] | None = None
        self.begun = False  # whether that transaction has begun (a lazy one waits for a write)
        self.checkpoints: Checkpoints | None = None  # told of each commit, for a file

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        with self.lock:
            return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> sqlite3.Cursor:
        with self.lock:
            return super().executemany(sql, parameters)

    def executescript(self, script: str, /) -> sqlite3.Cursor:
        with self.lock:
            return super().executescript(script)


def exclusive(db: sqlite3.Connection) -> contextlib.AbstractContextManager[object]:
    """Hold ``db`` for a transaction or a series of statements (no-op for a plain one)."""
    lock = getattr(db, "lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def open_database(path: Path | None) -> sqlite3.Connection:
    """Open (creating) the state database; ``None`` gives a private in-memory one.

    WAL with ``synchronous=NORMAL``: a commit costs no fsync, a crash loses at most the last
    moments, and readers in other processes (``deepmem expand``) never block the proxy. The
    log is checkpointed by ``Checkpoints``, not by the commit that fills it.
    Raises ``StateUnavailable`` when the file cannot be opened as a database.
    """
    target = ":memory:" if path is None else str(path)
    try:
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            target,
            timeout=BUSY_TIMEOUT_SECONDS,
            check_same_thread=False,
            isolation_level=None,
            factory=SerializedConnection,
        )
    except (OSError, sqlite3.Error) as exc:
        raise StateUnavailable(f"cannot open {path}: {exc}") from exc
    try:
        if path is not None:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA wal_autocheckpoint=0")
            connection.checkpoints = Checkpoints(path)
        connection.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        connection.close()
        raise StateUnavailable(f"cannot open {path}: {exc}") from exc
    return connection


@contextlib.contextmanager
def state_errors(doing: str) -> Iterator[None]:
    """Raise SQLite's errors as ``StateUnavailable("<doing>: <why>")``."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StateUnavailable(f"{doing}: {exc}") from exc


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection, *, lazy: bool = False) -> Iterator[None]:
    """One transaction for every statement inside, the connection held by this thread: the
    write lock is taken at once (waiting at most the busy timeout), and nothing is kept unless
    COMMIT succeeds. Inside another one of this thread on ``db``, it is part of that one: its
    statements are kept or lost with the outer ones, and its ``after_commit`` work waits.
    ``lazy``: the transaction begins only when a write transaction inside it does (an outer
    one around writes that may all turn out to be unneeded costs nothing then)."""
    with exclusive(db):
        if getattr(db, "committing", None) is not None:
            if isinstance(db, SerializedConnection) and not db.begun:
                db.execute("BEGIN IMMEDIATE")
                db.begun = True
            yield
            return
        work: list[Callable[[], None]] = []
        shared = db if isinstance(db, SerializedConnection) else None
        begin_now = not lazy or shared is None
        if shared is not None:
            shared.committing, shared.begun = work, begin_now
        try:
            if begin_now:
                db.execute("BEGIN IMMEDIATE")
            try:
                yield
                if shared is None or shared.begun:
                    db.execute("COMMIT")
                    if shared is not None and shared.checkpoints is not None:
                        shared.checkpoints.nudge()
            except BaseException:
                if db.in_transaction:
                    # SQLite may have rolled back already (disk full, I/O error); the cause is
                    # raised.
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                raise
        finally:
            if shared is not None:
                shared.committing, shared.begun = None, False
        for done in work:
            done()


def after_commit(db: sqlite3.Connection, work: Callable[[], None]) -> None:
    """Run ``work`` once the write transaction open on ``db`` has committed (now, if none is):
    what may only be believed once the rows are durable (an in-process cache of them)."""
    committing = getattr(db, "committing", None)
    if committing is None:
        work()
    else:
        committing.append(work)
