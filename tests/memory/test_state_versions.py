"""A session's state written by two processes: the second writer is detected, never silently
overwrites, and decides again on what the first one saved."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from compressors.pipeline import Decision
from memory.db import open_database
from memory.injection_memo import Injected, InjectionMemo
from memory.memo import MemoStore
from memory.state import StateConflict, StateUnavailable


def test_a_save_over_a_newer_version_is_refused_and_the_next_load_reads_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    first, second = MemoStore(open_database(path)), MemoStore(open_database(path))
    mine, theirs = first.load("s"), second.load("s")
    first.save("s", mine, {"fp": Decision(1, "A's marker")})
    theirs.level = 2
    with pytest.raises(StateConflict, match="another process") as raised:
        second.save("s", theirs, {"fp": Decision(1, "B's marker")})
    assert isinstance(raised.value, StateUnavailable)  # one error type for every failure
    again = second.load("s")
    assert again is not theirs and again.decisions["fp"].text == "A's marker"
    assert again.level == 1 and again.version == 1
    again.level = 2
    second.save("s", again, {})
    assert MemoStore(open_database(path)).load("s").version == 2
    assert first.load("s").version == 1  # its live copy is stale until it saves …
    with pytest.raises(StateConflict):
        first.save("s", first.load("s"), {})
    assert first.load("s").level == 2  # … and then reads the other writer's state


def test_one_process_saves_as_often_as_it_likes(tmp_path: Path) -> None:
    store = MemoStore(open_database(tmp_path / "state.db"))
    memo = store.load("s")
    for n in range(5):
        store.save("s", memo, {f"fp{n}": Decision(1, str(n))})
    assert memo.version == 5
    assert len(MemoStore(open_database(tmp_path / "state.db")).load("s").decisions) == 5


def test_a_database_from_before_versions_is_upgraded_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE memo_session (session TEXT PRIMARY KEY, level INTEGER NOT NULL, "
        "thresholds_crossed INTEGER NOT NULL, turn TEXT, events INTEGER NOT NULL, "
        "updated REAL NOT NULL) WITHOUT ROWID;"
        "INSERT INTO memo_session VALUES ('s', 2, 1, 'turn', 3, 0);"
    )
    old.commit()
    old.close()
    store = MemoStore(open_database(path))
    memo = store.load("s")
    assert (memo.level, memo.events, memo.version) == (2, 3, 0)
    store.save("s", memo, {})
    assert MemoStore(open_database(path)).load("s").version == 1


def test_the_first_injection_written_is_the_one_both_processes_send(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first, second = InjectionMemo(open_database(path)), InjectionMemo(open_database(path))
    second.load("s")  # B holds a live copy from before A wrote
    first.add("s", "anchor#0", Injected("A's recall", 0, ("memory",)))
    first.set_stable("s", "A's stable block")
    second.add("s", "anchor#0", Injected("B's recall", 0))
    second.set_stable("s", "B's stable block")
    live = second.load("s")
    assert live.by_anchor["anchor#0"] == Injected("A's recall", 0, ("memory",))
    assert live.stable == "A's stable block"


def test_a_replica_that_lost_the_race_decides_again_on_the_winners_state(
    tmp_path: Path,
) -> None:
    import orjson

    from compressors.pipeline import CompressionSettings
    from compressors.view import Dialect
    from memory.ccr import OriginalStore
    from proxy.compression import STATE_WRITES, CompressionStage
    from proxy.health import Health
    from proxy.pipeline import Outcome, rewrite_request

    path = tmp_path / "state.db"
    health = Health()

    def replica() -> CompressionStage:
        db = open_database(path)
        return CompressionStage(
            CompressionSettings(arrival_kinds=frozenset()), MemoStore(db), OriginalStore(db),
            health=health,
        )  # fmt: skip

    log = "\n".join(f"line {n}: value_{n} = compute_{n}(input_{n})" for n in range(400))
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "task"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": log},
        {"role": "assistant", "tool_calls": [
            {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    raw = orjson.dumps({"model": "m", "messages": messages, "tools": tools})
    headers = {"x-session-id": "raced"}
    a, b = replica(), replica()
    b.memos.load("raced")  # B read the session before A's save
    first = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, [a])
    assert first.outcome == Outcome.REWRITTEN
    lost = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, [b])
    # Its save conflicted: it read A's decisions and decided again, so both forward one form.
    assert lost.outcome == Outcome.REWRITTEN and lost.body == first.body
    assert STATE_WRITES not in health.problems()  # a race is not a broken database
    again = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, [b])
    assert again.body == first.body
