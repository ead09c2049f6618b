"""A request's durable writes cost one short transaction: nested writes join the outer one,
and what may only be believed once they are durable waits for its commit."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from compressors.pipeline import SessionMemo
from compressors.view import Dialect
from memory.ccr import OriginalStore
from memory.db import after_commit, open_database, write_transaction
from memory.memo import MemoStore
from memory.state import StateConflict
from proxy.addons import build_addons
from proxy.config import load_settings
from proxy.pipeline import Outcome, rewrite_request
from proxy.stores import open_stores


def test_a_nested_transaction_joins_the_outer_one_and_its_after_commit_work_waits(
    tmp_path: Path,
) -> None:
    db = open_database(tmp_path / "t.sqlite3")
    db.execute("CREATE TABLE t (x INTEGER)")
    done: list[str] = []
    with write_transaction(db):
        with write_transaction(db):
            db.execute("INSERT INTO t VALUES (1)")
            after_commit(db, lambda: done.append("inner"))
        assert done == [] and db.in_transaction
        db.execute("INSERT INTO t VALUES (2)")
    assert done == ["inner"] and not db.in_transaction
    with pytest.raises(RuntimeError), write_transaction(db):
        with write_transaction(db):
            db.execute("INSERT INTO t VALUES (3)")
            after_commit(db, lambda: done.append("lost"))
        raise RuntimeError("the outer part fails")
    assert done == ["inner"]
    assert [row[0] for row in db.execute("SELECT x FROM t ORDER BY x")] == [1, 2]
    after_commit(db, lambda: done.append("now"))  # no transaction open: at once
    assert done == ["inner", "now"]
    statements: list[str] = []
    db.set_trace_callback(statements.append)
    with write_transaction(db, lazy=True):  # nothing written inside: nothing begun
        pass
    with write_transaction(db, lazy=True), write_transaction(db):
        db.execute("INSERT INTO t VALUES (4)")
    assert statements == ["BEGIN IMMEDIATE", "INSERT INTO t VALUES (4)", "COMMIT"]


def test_originals_are_neither_kept_nor_cached_when_the_decisions_cannot_be_saved(
    tmp_path: Path,
) -> None:
    """A conflict saving the memo rolls back the originals written in the same transaction,
    and none of them is taken for stored (a cached original is never written again)."""
    settings = load_settings({"data_dir": str(tmp_path)}, environ={})
    stores = open_stores(settings)
    originals, memos = stores.originals, stores.memos
    assert isinstance(originals, OriginalStore) and isinstance(memos, MemoStore)
    memos.save("ses", memos.load("ses"), {})
    stale = SessionMemo()  # as read before that save, by another process
    with pytest.raises(StateConflict), stores.transaction():
        originals.put_many({"a" * 24: "the original"})
        memos.save("ses", stale, {})
    assert originals.get("a" * 24) is None
    originals.put_many({"a" * 24: "the original"})  # written now, since it was not cached
    assert originals.get("a" * 24) == b"the original"


def test_a_compressing_request_commits_its_originals_and_decisions_in_one_transaction(
    tmp_path: Path,
) -> None:
    settings = load_settings({"data_dir": str(tmp_path)}, environ={})
    stores = open_stores(settings)
    addons = build_addons(settings, stores)
    statements: list[str] = []
    db = stores.originals.db  # type: ignore[attr-defined]
    assert isinstance(db, sqlite3.Connection)
    db.set_trace_callback(statements.append)
    log = "\n".join(f"line {n}: ok test_{n} passed in {n / 7:.3f}s" for n in range(600))
    messages: list[dict[str, object]] = [{"role": "user", "content": "run the tests"}]
    for step in range(3):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{step}",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command":"pytest"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{step}", "content": f"{log}\nrun {step}"},
        ]
    raw = orjson.dumps({"model": "m", "messages": messages, "tools": [{"x": 1}]})
    rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, {"x-session-id": "ses"}, addons)
    assert rewrite.outcome == Outcome.REWRITTEN and b"deep-memory" in rewrite.body
    assert sum(s.startswith("BEGIN") for s in statements) == 1
    assert sum(s.startswith("INSERT INTO ccr_original") for s in statements) >= 1
    statements.clear()  # the same request again: nothing new to keep, no transaction at all
    again = rewrite_request(raw, Dialect.OPENAI_CHAT, {"x-session-id": "ses"}, addons)
    assert again.body == rewrite.body and not any(s.startswith("BEGIN") for s in statements)
