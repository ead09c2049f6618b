"""The write-ahead log is checkpointed on a thread of its own, never by a request's commit."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from memory import db as database
from memory.db import open_database, write_transaction

PAGES_PAST_THE_AUTOMATIC_LIMIT = 6 * 1024 * 1024  # bytes: SQLite's own limit is 1,000 pages


def checkpoint_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "deepmem-wal"]


def wait_for(condition, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def table_in(path: Path) -> sqlite3.Connection:
    db = open_database(path)
    db.execute("CREATE TABLE t (x BLOB)")
    return db


def test_a_commit_leaves_the_checkpoint_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the commit that took the log past 1,000 pages copied it into the database
    file and synced it there, on the request's path."""
    monkeypatch.setattr(database, "CHECKPOINT_QUIET_SECONDS", 1.0)
    path = tmp_path / "state.sqlite3"
    db = open_database(path)
    db.execute("CREATE TABLE t (x BLOB)")
    assert db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    before = path.stat().st_size
    with write_transaction(db):
        db.execute("INSERT INTO t VALUES (?)", (b"x" * PAGES_PAST_THE_AUTOMATIC_LIMIT,))
    assert path.stat().st_size == before  # in the log only: the commit did not checkpoint
    assert wait_for(lambda: path.stat().st_size > PAGES_PAST_THE_AUTOMATIC_LIMIT)
    db.close()


def test_the_thread_ends_when_commits_stop_and_a_commit_starts_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_QUIET_SECONDS", 0.01)
    monkeypatch.setattr(database, "CHECKPOINT_POLL_SECONDS", 0.01)
    monkeypatch.setattr(database, "CHECKPOINT_IDLE_SECONDS", 0.2)
    path = tmp_path / "state.sqlite3"
    db = table_in(path)
    for round_ in range(2):
        with write_transaction(db):
            db.execute("INSERT INTO t VALUES (?)", (b"y" * PAGES_PAST_THE_AUTOMATIC_LIMIT,))
        assert checkpoint_threads()
        size = (round_ + 1) * PAGES_PAST_THE_AUTOMATIC_LIMIT
        assert wait_for(lambda size=size: path.stat().st_size > size)
        assert wait_for(lambda: not checkpoint_threads())
    db.close()


def commit_big_rows(db: sqlite3.Connection, rows: int, every: float) -> None:
    for _ in range(rows):
        with write_transaction(db):
            db.execute("INSERT INTO t VALUES (?)", (b"z" * (256 * 1024),))
        time.sleep(every)


def test_commits_that_keep_coming_are_checkpointed_when_they_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: a checkpoint every 0.1 s of commits synced the database file beside the
    requests being rewritten, and slowed their commits."""
    monkeypatch.setattr(database, "CHECKPOINT_QUIET_SECONDS", 1.0)
    monkeypatch.setattr(database, "CHECKPOINT_POLL_SECONDS", 0.01)
    path = tmp_path / "state.sqlite3"
    db = table_in(path)
    before = path.stat().st_size
    commit_big_rows(db, 40, every=0.03)  # over 1 s of commits, never 1 s apart
    assert path.stat().st_size == before
    assert wait_for(lambda: path.stat().st_size > 40 * 256 * 1024)
    db.close()


def test_commits_that_never_pause_are_checkpointed_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_QUIET_SECONDS", 60.0)
    monkeypatch.setattr(database, "CHECKPOINT_BUSY_SECONDS", 0.2)
    monkeypatch.setattr(database, "CHECKPOINT_POLL_SECONDS", 0.01)
    path = tmp_path / "state.sqlite3"
    db = table_in(path)
    before = path.stat().st_size
    deadline = time.monotonic() + 10
    while path.stat().st_size == before and time.monotonic() < deadline:
        commit_big_rows(db, 1, every=0.02)
    assert path.stat().st_size > before
    db.close()


def test_an_in_memory_database_has_no_checkpoints() -> None:
    db = open_database(None)
    db.execute("CREATE TABLE t (x INTEGER)")
    with write_transaction(db):
        db.execute("INSERT INTO t VALUES (1)")
    assert getattr(db, "checkpoints", None) is None


def test_a_database_removed_meanwhile_is_not_created_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "CHECKPOINT_POLL_SECONDS", 0.01)
    monkeypatch.setattr(database, "CHECKPOINT_IDLE_SECONDS", 0.2)
    directory = tmp_path / "data dir with spaces"
    directory.mkdir()
    path = directory / "state.sqlite3"
    db = open_database(path)
    checkpoints = db.checkpoints  # type: ignore[attr-defined]
    db.close()
    path.unlink()
    checkpoints.nudge()
    assert wait_for(lambda: not checkpoint_threads())
    assert not path.exists()
