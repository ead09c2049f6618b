"""``deepmem history ...``: OpenCode's own database, read strictly read-only."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from memory.opencode_history import OpenCodeHistory, OpenCodeHistoryError, default_opencode_db
from proxy.cli import main
from tests.cli_result import Result, run

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "opencode"
SCHEMA = FIXTURES / "opencode-1.18.33-db-schema.sql"
# Rows the real OpenCode 1.18.33 wrote (two turns with auto-compaction; a task subagent).
REAL_ROWS = FIXTURES / "opencode-1.18.33-db-rows.json"

REAL_SESSION = "ses_e0255a1c8ffeBR3oi5KX1G4lMZ"
REAL_PARENT = "ses_e02555d4bffeW7sBaTP2C0cf0X"
REAL_CHILD = "ses_e025554b0ffexA6eJg8SaDT0BP"
APP = "ses_f100000000001AppMigration"
SUB = "ses_f100000000002AppSubParser"
OTHER = "ses_f100000000003OtherProject"
T0 = 1_800_000_000_000
SIDECARS = ("-wal", "-shm", "-journal")

TOOL_LINES = "\n".join(f"{n}: migration step {n}" for n in range(1, 301))


# ---------------------------------------------------------------- the database


def _session_row(sid: str, directory: str, title: str, t: int, parent: str | None = None) -> dict:
    return {
        "id": sid,
        "project_id": "proj_app",
        "parent_id": parent,
        "slug": "calm-lake",
        "directory": directory,
        "title": title,
        "version": "1.18.33",
        "agent": "build",
        "model": json.dumps({"id": "fake-model", "providerID": "fake", "variant": "default"}),
        "time_created": t,
        "time_updated": t + 60_000,
    }


def _user(mid: str, sid: str, t: int) -> dict:
    data = {
        "role": "user",
        "time": {"created": t},
        "agent": "build",
        "model": {"providerID": "fake", "modelID": "fake-model"},
        "summary": {"diffs": []},
    }
    return {"id": mid, "session_id": sid, "time_created": t, "time_updated": t, "data": data}


def _assistant(mid: str, sid: str, parent: str, t: int, **extra: Any) -> dict:
    data = {
        "parentID": parent,
        "role": "assistant",
        "mode": "build",
        "agent": "build",
        "path": {"cwd": "/work/app", "root": "/work/app"},
        "cost": 0,
        "tokens": {"total": 20, "input": 10, "output": 10, "reasoning": 0, "cache": {}},
        "modelID": "fake-model",
        "providerID": "fake",
        "time": {"created": t, "completed": t + 500},
        "finish": "stop",
        **extra,
    }
    return {"id": mid, "session_id": sid, "time_created": t, "time_updated": t, "data": data}


def _part(pid: str, mid: str, sid: str, t: int, data: dict | str) -> dict:
    return {
        "id": pid,
        "message_id": mid,
        "session_id": sid,
        "time_created": t,
        "time_updated": t,
        "data": data,
    }


def _tool(name: str, call: str, state: dict) -> dict:
    return {"type": "tool", "tool": name, "callID": call, "state": state}


def _synthetic_rows() -> dict[str, list[dict]]:
    """Sessions shaped like the real rows, with Chinese text and the awkward cases."""
    step_start = {"type": "step-start", "snapshot": "cfece04c"}
    step_finish = {"type": "step-finish", "reason": "stop", "cost": 0, "tokens": {}}
    t = T0
    sessions = [
        _session_row(APP, "/work/app", "修复数据库迁移", t),
        _session_row(SUB, "/work/app/sub", "Refactor the parser", t + 100_000),
        _session_row(OTHER, "/work/app2", "Unrelated app2 session", t + 200_000),
    ]
    messages = [
        _user("msg_a1", APP, t + 1000),
        _assistant("msg_a2", APP, "msg_a1", t + 2000, finish="tool-calls"),
        _assistant("msg_a3", APP, "msg_a1", t + 3000),
        {
            "id": "msg_a4",
            "session_id": APP,
            "time_created": t + 4000,
            "time_updated": t + 4000,
            "data": "{oops, not json",
        },
        _user("msg_b1", SUB, t + 101_000),
        _assistant("msg_b2", SUB, "msg_b1", t + 102_000),
        _user("msg_c1", OTHER, t + 201_000),
    ]
    parts = [
        _part(
            "prt_a1_1",
            "msg_a1",
            APP,
            t + 1000,
            {"type": "text", "text": "请修复数据库迁移脚本中的错误 (fix the migration script)\n"},
        ),
        _part("prt_a2_1", "msg_a2", APP, t + 2001, step_start),
        _part(
            "prt_a2_2",
            "msg_a2",
            APP,
            t + 2002,
            {
                "type": "reasoning",
                "text": "用户希望修复迁移。I should read migrate.py first.",
                "time": {"start": t + 2002, "end": t + 2003},
            },
        ),
        _part(
            "prt_a2_3",
            "msg_a2",
            APP,
            t + 2004,
            _tool(
                "read",
                "call_read_1",
                {
                    "status": "completed",
                    "input": {"filePath": "/work/app/migrate.py"},
                    "output": TOOL_LINES,
                    "metadata": {"truncated": False},
                    "title": "migrate.py",
                    "time": {"start": t + 2004, "end": t + 2005},
                },
            ),
        ),
        _part("prt_a2_4", "msg_a2", APP, t + 2006, step_finish),
        _part("prt_a3_1", "msg_a3", APP, t + 3001, step_start),
        _part(
            "prt_a3_2",
            "msg_a3",
            APP,
            t + 3002,
            _tool(
                "bash",
                "call_bash_1",
                {
                    "status": "error",
                    "input": {"command": "pytest -q", "description": "Run the tests"},
                    "error": "Command failed: exit code 1",
                    "time": {"start": t + 3002, "end": t + 3003},
                },
            ),
        ),
        _part(
            "prt_a3_3",
            "msg_a3",
            APP,
            t + 3004,
            {
                "type": "text",
                "text": "迁移脚本已修复 — the ALTER TABLE statement now runs in a transaction.",
            },
        ),
        _part(
            "prt_a3_4",
            "msg_a3",
            APP,
            t + 3005,
            {"type": "patch", "hash": "abc", "files": ["/work/app/migrate.py"]},
        ),
        _part("prt_a3_5", "msg_a3", APP, t + 3006, {"type": "mystery-part", "text": "hidden"}),
        _part("prt_a3_6", "msg_a3", APP, t + 3007, "{not json at all"),
        _part("prt_a3_7", "msg_a3", APP, t + 3008, step_finish),
        _part("prt_a4_1", "msg_a4", APP, t + 4001, {"type": "text", "text": "orphan text"}),
        _part("prt_b1_1", "msg_b1", SUB, t + 101_001, {"type": "text", "text": "Refactor Parser"}),
        _part(
            "prt_b2_1",
            "msg_b2",
            SUB,
            t + 102_001,
            {
                "type": "text",
                "text": "Done refactoring the PARSER module; 解析器已重构。 Über-fast.",
            },
        ),
        _part(
            "prt_c1_1",
            "msg_c1",
            OTHER,
            t + 201_001,
            {"type": "text", "text": "the parser is mentioned here too"},
        ),
    ]
    project = {
        "id": "proj_app",
        "worktree": "/work/app",
        "vcs": "git",
        "time_created": t,
        "time_updated": t,
        "sandboxes": "[]",
    }
    return {"project": [project], "session": sessions, "message": messages, "part": parts}


def _insert(connection: sqlite3.Connection, table: str, row: dict) -> None:
    values = {
        key: json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else value
        for key, value in row.items()
    }
    columns = ", ".join(values)
    marks = ", ".join("?" for _ in values)
    connection.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", list(values.values()))


def build_database(path: Path) -> None:
    connection = sqlite3.connect(path)
    connection.executescript(SCHEMA.read_text())
    assert connection.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
    real = json.loads(REAL_ROWS.read_text())["tables"]
    for rows in (real, _synthetic_rows()):
        for table in ("project", "session", "message", "part"):
            for row in rows[table]:
                _insert(connection, table, row)
    connection.commit()
    connection.close()


@dataclass(frozen=True)
class Snapshot:
    digest: str
    mtime_ns: int
    files: frozenset[str]


def snapshot(path: Path) -> Snapshot:
    return Snapshot(
        hashlib.sha256(path.read_bytes()).hexdigest(),
        path.stat().st_mtime_ns,
        frozenset(p.name for p in path.parent.iterdir()),
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pristine") / "opencode.db"
    build_database(path)
    return path


@pytest.fixture
def db(pristine: Path, tmp_path: Path) -> Iterator[Path]:
    """A closed OpenCode database in WAL mode; unchanged, with no side files, after each test."""
    path = tmp_path / "opencode" / "opencode.db"
    path.parent.mkdir()
    path.write_bytes(pristine.read_bytes())
    before = snapshot(path)
    assert path.read_bytes()[18:20] == b"\x02\x02", "WAL mode, like OpenCode's"
    yield path
    after = snapshot(path)
    assert after == before
    assert not [name for name in after.files if name.endswith(SIDECARS)]


@pytest.fixture
def history(db: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    def history_cli(*argv: str, database: Path | None = None) -> Result:
        return run(capsys, ["history", *argv, "--opencode-db", str(database or db)])

    return history_cli


# ---------------------------------------------------------------- sessions


def test_sessions_newest_first_with_counts(history: Any) -> None:
    result = history("sessions")
    assert result.code == 0, result.err
    lines = [line for line in result.out.splitlines() if line.startswith("ses_")]
    ids = [line.split()[0] for line in lines]
    assert ids == [OTHER, SUB, APP, REAL_PARENT, REAL_CHILD, REAL_SESSION]
    assert "修复数据库迁移" in lines[2] and " 4 msgs" in lines[2]
    assert f"(subagent of {REAL_PARENT})" in result.out
    assert "/tmp/oc/e2e-compat/repo" in result.out


def test_sessions_json(history: Any) -> None:
    result = history("sessions", "--json", "--limit", "3")
    assert result.code == 0, result.err
    sessions = result.json["sessions"]
    assert [s["id"] for s in sessions] == [OTHER, SUB, APP]
    app = sessions[2]
    assert app["title"] == "修复数据库迁移"
    assert app["directory"] == "/work/app"
    assert app["parent_id"] is None
    assert app["message_count"] == 4
    assert app["time_created"] == T0
    assert app["created"].endswith("Z")
    real = history("sessions", "--json").json["sessions"]
    child = next(s for s in real if s["id"] == REAL_CHILD)
    assert child["parent_id"] == REAL_PARENT
    assert child["title"] == "Explore the repo (@explore subagent)"


def test_sessions_directory_filter_includes_subdirectories_only(history: Any) -> None:
    result = history("sessions", "--directory", "/work/app", "--json")
    assert {s["id"] for s in result.json["sessions"]} == {APP, SUB}
    result = history("sessions", "--directory", "/work/app/sub/", "--json")
    assert [s["id"] for s in result.json["sessions"]] == [SUB]
    result = history("sessions", "--directory", "/nowhere")
    assert result.code == 0
    assert "no OpenCode sessions for /nowhere" in result.out


# ---------------------------------------------------------------- messages


def test_messages_render_parts_in_order(history: Any) -> None:
    result = history("messages", APP)
    assert result.code == 0, result.err
    out = result.out
    assert out.startswith(f"{APP}  修复数据库迁移")
    order = [
        "── user ·",
        "请修复数据库迁移脚本中的错误",
        "── assistant · build · fake/fake-model ·",
        "[reasoning] 用户希望修复迁移。I should read migrate.py first.",
        'read({"filePath": "/work/app/migrate.py"}) -> 1: migration step 1 2: migration',
        'bash({"command": "pytest -q", "description": "Run the tests"}) -> error: Command '
        "failed: exit code 1",
        "迁移脚本已修复 — the ALTER TABLE statement now runs in a transaction.",
        "[patch] /work/app/migrate.py",
        "[mystery-part]",
        "[unreadable part]",
        "── ? ·",
        "orphan text",
    ]
    positions = [out.index(piece) for piece in order]
    assert positions == sorted(positions)
    assert "step-start" not in out and "step-finish" not in out and "hidden" not in out
    assert "migration step 300" not in out, "long tool output is shortened"


def test_messages_full_keeps_tool_output_whole(history: Any) -> None:
    short = history("messages", APP).out
    full = history("messages", APP, "--full").out
    assert "…" in short
    assert "300: migration step 300" in full
    assert TOOL_LINES in full


def test_messages_of_real_opencode_session(history: Any) -> None:
    result = history("messages", REAL_SESSION)
    assert result.code == 0, result.err
    out = result.out
    assert "List the files in this repo and tell me what README.md says" in out
    assert 'bash({"command": "ls", "description": "List files in the working directory"}) ->' in out
    assert "README.md hello.py" in out
    assert "[reasoning] The user wants me to look at the repository." in out
    assert "[compaction (auto)]" in out
    assert "── assistant (compaction summary) · compaction ·" in out
    assert "Fake summary of the conversation so far." in out
    assert "[synthetic] Continue if you have next steps" in out
    assert out.count("── user ·") == 4
    assert out.count("── assistant") == 8


def test_messages_json(history: Any) -> None:
    result = history("messages", APP, "--json")
    assert result.code == 0, result.err
    payload = result.json
    assert payload["session"]["id"] == APP
    messages = payload["messages"]
    assert [m["id"] for m in messages] == ["msg_a1", "msg_a2", "msg_a3", "msg_a4"]
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant", "?"]
    assert messages[1]["model"] == "fake/fake-model"
    assert [p["type"] for p in messages[1]["parts"]] == ["reasoning", "tool"]
    assert [p["type"] for p in messages[2]["parts"]] == [
        "tool",
        "text",
        "patch",
        "mystery-part",
        "?",
    ]
    assert messages[0]["text"].startswith("请修复数据库迁移脚本中的错误")
    real = history("messages", REAL_SESSION, "--json").json["messages"]
    assert [m["summary"] for m in real].count(True) == 1


def test_messages_unknown_session(history: Any) -> None:
    result = history("messages", "ses_missing")
    assert result.code == 1
    assert result.err.startswith("deepmem: no session 'ses_missing'")
    assert "Traceback" not in result.err


# ---------------------------------------------------------------- search


def test_search_chinese(history: Any) -> None:
    result = history("search", "数据库迁移")
    assert result.code == 0, result.err
    assert APP in result.out
    assert "请修复数据库迁移脚本中的错误" in result.out
    assert "user text" in result.out
    hits = history("search", "解析器", "--json").json["results"]
    assert [(h["session_id"], h["message_id"], h["role"]) for h in hits] == [
        (SUB, "msg_b2", "assistant")
    ]
    assert "解析器已重构" in hits[0]["snippet"]


def test_search_is_case_insensitive_and_needs_every_term(history: Any) -> None:
    hits = history("search", "parser", "--json").json["results"]
    assert [h["message_id"] for h in hits] == ["msg_c1", "msg_b2", "msg_b1"]
    hits = history("search", "PARSER module", "--json").json["results"]
    assert [h["message_id"] for h in hits] == ["msg_b2"]
    assert history("search", "parser nonexistentword", "--json").json["results"] == []


def test_search_session_filter_and_limit(history: Any) -> None:
    hits = history("search", "parser", "--session", SUB, "--json").json["results"]
    assert {h["session_id"] for h in hits} == {SUB}
    assert len(hits) == 2
    hits = history("search", "parser", "--limit", "1", "--json").json["results"]
    assert [h["message_id"] for h in hits] == ["msg_c1"]
    result = history("search", "parser", "--session", "ses_missing")
    assert result.code == 1
    assert "no session 'ses_missing'" in result.err


def test_search_tool_calls_and_reasoning(history: Any) -> None:
    hits = history("search", "exit code 1", "--json").json["results"]
    assert [(h["message_id"], h["part_type"]) for h in hits] == [("msg_a3", "tool:bash")]
    hits = history("search", "step 250", "--json").json["results"]
    assert [(h["part_type"], h["role"]) for h in hits] == [("tool:read", "assistant")]
    assert "250: migration step 250" in hits[0]["snippet"]
    hits = history("search", "read migrate.py", "--session", APP, "--json").json["results"]
    assert [h["part_type"] for h in hits] == ["tool:read", "reasoning"]
    hits = history("search", "hello.py", "--session", REAL_SESSION, "--json").json["results"]
    assert {h["part_type"] for h in hits} >= {"text", "tool:bash"}


def test_search_text_output_and_no_match(history: Any) -> None:
    result = history("search", "ALTER table")
    assert result.code == 0
    assert result.out.splitlines()[0].startswith(f"{APP}  ")
    assert "assistant text  msg_a3  修复数据库迁移" in result.out
    result = history("search", "zzz-not-there")
    assert result.code == 0
    assert "no matches for 'zzz-not-there'" in result.out


def test_search_terms_with_quotes_and_non_ascii_case(history: Any, db: Path) -> None:
    # A quote is escaped in the stored JSON and "Ü" is not folded by SQLite's lower().
    hits = history("search", '"command": "pytest', "--json").json["results"]
    assert [(h["message_id"], h["part_type"]) for h in hits] == [("msg_a3", "tool:bash")]
    hits = history("search", "über-FAST", "--json").json["results"]
    assert [h["message_id"] for h in hits] == ["msg_b2"]
    with OpenCodeHistory(db) as reader:
        assert [h.message_id for h in reader.search("— THE alter")] == ["msg_a3"]


def test_empty_query_is_a_usage_error(history: Any) -> None:
    result = history("search", "   ")
    assert result.code == 2
    assert result.err == "deepmem: the search query is empty\n"


# ---------------------------------------------------------------- read-only


def test_reading_leaves_the_database_untouched(history: Any, db: Path) -> None:
    before = snapshot(db)
    for argv in (
        ("sessions",),
        ("sessions", "--json", "--directory", "/work/app"),
        ("messages", APP, "--full"),
        ("messages", REAL_SESSION, "--json"),
        ("search", "数据库"),
        ("search", "parser", "--session", SUB, "--json"),
    ):
        assert history(*argv).code == 0
    assert snapshot(db) == before
    assert sorted(p.name for p in db.parent.iterdir()) == ["opencode.db"]


def test_reads_a_live_wal_without_touching_the_main_file(
    history: Any, pristine: Path, tmp_path: Path
) -> None:
    # OpenCode running: a writer keeps -wal/-shm and its newest rows live only in the WAL.
    db = tmp_path / "live" / "opencode.db"
    db.parent.mkdir()
    db.write_bytes(pristine.read_bytes())
    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA wal_autocheckpoint=0")
        _insert(writer, "session", _session_row("ses_live", "/work/live", "live 会话", T0 * 2))
        writer.commit()
        main_file = snapshot(db)
        assert {"opencode.db-wal", "opencode.db-shm"} <= main_file.files
        result = history("sessions", "--json", "--limit", "1", database=db)
        assert [s["title"] for s in result.json["sessions"]] == ["live 会话"]
        assert snapshot(db) == main_file
        _insert(writer, "session", _session_row("ses_live2", "/work/live", "after", T0 * 3))
        writer.commit()
    finally:
        writer.execute("DELETE FROM session WHERE id IN ('ses_live', 'ses_live2')")
        writer.commit()
        writer.close()
    assert not (db.parent / "opencode.db-wal").exists()


def test_reader_cannot_write(db: Path) -> None:
    with OpenCodeHistory(db) as reader, pytest.raises(sqlite3.Error):
        reader.connection.execute("DELETE FROM part")


# ---------------------------------------------------------------- errors


def test_missing_database(history: Any, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "opencode.db"
    result = history("sessions", database=missing)
    assert result.code == 1
    assert result.err == f"deepmem: no OpenCode database at {missing}\n"
    assert not missing.parent.exists()


def test_not_a_sqlite_file(history: Any, tmp_path: Path) -> None:
    bogus = tmp_path / "opencode.db"
    bogus.write_text("just some text, not a database\n")
    for argv in (("sessions",), ("messages", APP), ("search", "x")):
        result = history(*argv, database=bogus)
        assert result.code == 1
        assert result.err == f"deepmem: {bogus} is not a SQLite database\n"
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert history("sessions", database=empty).err == f"deepmem: {empty} is not a SQLite database\n"
    assert history("sessions", database=tmp_path).err == f"deepmem: {tmp_path} is not a file\n"


def test_sqlite_file_without_opencode_tables(history: Any, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    connection.commit()
    connection.close()
    before = snapshot(other)
    result = history("sessions", database=other)
    assert result.code == 1
    assert result.err == f"deepmem: {other} is not an OpenCode database (no 'session' table)\n"
    assert snapshot(other) == before


def test_session_table_with_another_shape(history: Any, tmp_path: Path) -> None:
    odd = tmp_path / "odd.db"
    connection = sqlite3.connect(odd)
    connection.execute("CREATE TABLE session (id TEXT PRIMARY KEY, name TEXT)")
    connection.close()
    result = history("sessions", database=odd)
    assert result.code == 1
    assert "unknown OpenCode schema: table 'session' lacks directory" in result.err


def test_bad_limit_is_a_usage_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["history", "sessions", "--limit", "0", "--opencode-db", str(db)])
    assert exc.value.code == 2
    assert "must be at least 1" in capsys.readouterr().err


def test_library_error_type(tmp_path: Path) -> None:
    with pytest.raises(OpenCodeHistoryError, match="no OpenCode database"):
        OpenCodeHistory(tmp_path / "missing.db")


# ---------------------------------------------------------------- default location


def test_default_database_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_opencode_db() == tmp_path / "xdg" / "opencode" / "opencode.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".local" / "share" / "opencode" / "opencode.db"
    assert default_opencode_db() == expected


def test_cli_uses_the_default_database(
    db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(db.parent.parent))
    db.parent.rename(db.parent.parent / "opencode-real")
    try:
        assert main(["history", "sessions"]) == 1
        assert "no OpenCode database at" in capsys.readouterr().err
        (db.parent.parent / "opencode-real").rename(db.parent)
        assert main(["history", "sessions", "--limit", "1"]) == 0
        assert OTHER in capsys.readouterr().out
    finally:
        if not db.parent.exists():
            (db.parent.parent / "opencode-real").rename(db.parent)
