"""The SQLite database in the data dir that holds durable proxy state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

DB_NAME = "deepmem.sqlite3"


def open_database(path: Path | None) -> sqlite3.Connection:
    """Open (creating) the state database; ``None`` gives a private in-memory one.

    WAL with ``synchronous=NORMAL``: a commit costs no fsync, a crash loses at most the last
    moments, and readers in other processes (``deepmem expand``) never block the proxy.
    """
    if path is None:
        connection = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(
            str(path), timeout=5.0, check_same_thread=False, isolation_level=None
        )
        connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA busy_timeout=5000")
    return connection
