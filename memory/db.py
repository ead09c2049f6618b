"""The SQLite database in the data dir that holds durable proxy state."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from memory.state import StateUnavailable

DB_NAME = "deepmem.sqlite3"
BUSY_TIMEOUT_SECONDS = 5.0  # the longest a statement waits for another connection's lock


def open_database(path: Path | None) -> sqlite3.Connection:
    """Open (creating) the state database; ``None`` gives a private in-memory one.

    WAL with ``synchronous=NORMAL``: a commit costs no fsync, a crash loses at most the last
    moments, and readers in other processes (``deepmem expand``) never block the proxy.
    Raises ``StateUnavailable`` when the file cannot be opened as a database.
    """
    if path is None:
        connection = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            str(path), timeout=BUSY_TIMEOUT_SECONDS, check_same_thread=False, isolation_level=None
        )
    except (OSError, sqlite3.Error) as exc:
        raise StateUnavailable(f"cannot open {path}: {exc}") from exc
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.Error as exc:
        connection.close()
        raise StateUnavailable(f"cannot open {path}: {exc}") from exc
    return connection


@contextmanager
def state_errors(doing: str) -> Iterator[None]:
    """Raise SQLite's errors as ``StateUnavailable("<doing>: <why>")``."""
    try:
        yield
    except sqlite3.Error as exc:
        raise StateUnavailable(f"{doing}: {exc}") from exc


@contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One transaction for every statement inside: the write lock is taken at once (waiting
    at most the busy timeout), and nothing is kept unless COMMIT succeeds."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            # SQLite may have rolled back already (disk full, I/O error); the cause is raised.
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise
