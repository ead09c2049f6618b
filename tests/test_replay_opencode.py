"""``deepmem replay --opencode``: OpenCode's own sessions (its opencode.db, read-only) turned
into transcripts and replayed in each provider's wire format, priced at the model's list
price when it has one."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from memory.opencode_history import OpenCodeHistory
from proxy.prices import DEFAULT
from proxy.replay_opencode import (
    COMPACTION_TEXT,
    INTERRUPTED,
    dialect_for,
    load_sessions,
    session_transcripts,
)
from tests.cli_result import Result, run
from tests.test_history import (
    APP,
    REAL_SESSION,
    SCHEMA,
    TOOL_LINES,
    _assistant,
    _insert,
    _part,
    _session_row,
    _tool,
    _user,
    build_database,
    snapshot,
)
from tests.test_replay_report import parse

T0 = 1_900_000_000_000
STEPS = 6


def big_output(step: int) -> str:
    return "\n".join(f"{step}.{n}: def handler_{step}_{n}(request): return {n}" for n in range(400))


def _agent_session(sid: str, provider: str, model: str, t: int) -> dict[str, list[dict]]:
    """A session of STEPS tool-calling steps that read big files, then an answer."""
    session = _session_row(sid, "/work/app", f"{provider} session", t)
    user = _user(f"{sid}_u", sid, t + 1)
    user["data"]["model"] = {"providerID": provider, "modelID": model}
    messages, parts = (
        [user],
        [_part(f"{sid}_p0", f"{sid}_u", sid, t + 1, {"type": "text", "text": "Find the bug"})],
    )
    for step in range(STEPS + 1):
        mid = f"{sid}_a{step:02d}"
        at = t + 10 * (step + 1)
        final = step == STEPS
        messages.append(
            _assistant(
                mid,
                sid,
                f"{sid}_u",
                at,
                providerID=provider,
                modelID=model,
                finish="stop" if final else "tool-calls",
            )
        )
        parts.append(_part(f"{mid}_0", mid, sid, at, {"type": "step-start"}))
        parts.append(
            _part(f"{mid}_1", mid, sid, at + 1, {"type": "reasoning", "text": f"think {step}"})
        )
        if final:
            parts.append(_part(f"{mid}_2", mid, sid, at + 2, {"type": "text", "text": "Found it."}))
        else:
            state = {
                "status": "completed",
                "input": {"filePath": f"/work/app/f{step}.py"},
                "output": big_output(step),
                "time": {"start": at, "end": at + 1},
            }
            parts.append(
                _part(f"{mid}_2", mid, sid, at + 2, _tool("read", f"call_{sid}_{step}", state))
            )
        parts.append(_part(f"{mid}_3", mid, sid, at + 3, {"type": "step-finish", "reason": "stop"}))
    return {"session": [session], "message": messages, "part": parts}


SESSIONS = {
    "ses_anthropic": ("anthropic", "claude-sonnet-4-5-20250929"),
    "ses_openai": ("openai", "gpt-5"),
    "ses_local": ("ollama", "qwen3-coder:30b"),
}


@pytest.fixture(scope="module")
def agent_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agent") / "opencode.db"
    connection = sqlite3.connect(path)
    connection.executescript(SCHEMA.read_text())
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute(
        "INSERT INTO project (id, worktree, vcs, time_created, time_updated, sandboxes) "
        "VALUES ('proj_app', '/work/app', 'git', 0, 0, '[]')"
    )
    for n, (sid, (provider, model)) in enumerate(SESSIONS.items()):
        rows = _agent_session(sid, provider, model, T0 + n * 1_000_000)
        for table in ("session", "message", "part"):
            for row in rows[table]:
                _insert(connection, table, row)
    connection.commit()
    connection.close()
    return path


@pytest.fixture(scope="module")
def fixture_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fixture") / "opencode.db"
    build_database(path)
    return path


def replay(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> Result:
    return run(capsys, ["replay", *argv, "--data-dir", str(tmp_path / "data")])


# ---------------------------------------------------------------- the conversion


def test_dialect_follows_the_provider() -> None:
    assert dialect_for("anthropic") == "anthropic"
    assert dialect_for("openai") == "responses"
    assert dialect_for("openrouter") == dialect_for(None) == "chat"


def test_parts_become_chat_messages_with_tool_calls_and_results(fixture_db: Path) -> None:
    with OpenCodeHistory(fixture_db) as history:
        [transcript] = session_transcripts(history.session(APP), history.stored_messages(APP))
    assert transcript.model == "fake/fake-model" and transcript.dialect == "chat"
    assert transcript.tools == ["read", "bash"]
    messages = transcript.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[0]["content"].startswith("请修复数据库迁移脚本中的错误")
    read = messages[1]
    assert read["content"] is None
    assert read["reasoning_content"] == "用户希望修复迁移。I should read migrate.py first."
    [call] = read["tool_calls"]
    assert call["id"] == "call_read_1" and call["function"]["name"] == "read"
    assert json.loads(call["function"]["arguments"]) == {"filePath": "/work/app/migrate.py"}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_read_1", "content": TOOL_LINES}
    bash = messages[3]
    assert bash["content"].startswith("迁移脚本已修复")
    assert bash["tool_calls"][0]["id"] == "call_bash_1"
    assert messages[4]["content"] == "Command failed: exit code 1"  # the error, as sent
    data = transcript.transcript()
    assert data["model"] == "fake/fake-model"
    assert [t["function"]["name"] for t in data["tools"]] == ["read", "bash"]


def test_a_compaction_starts_a_transcript_of_its_own(fixture_db: Path) -> None:
    with OpenCodeHistory(fixture_db) as history:
        stored = history.stored_messages(REAL_SESSION)
        first, second = session_transcripts(history.session(REAL_SESSION), stored)
    assert first.name == REAL_SESSION and second.name == REAL_SESSION + "+1"
    assert COMPACTION_TEXT not in json.dumps(first.messages)
    assert second.messages[0] == {"role": "user", "content": COMPACTION_TEXT}
    assert second.messages[1]["role"] == "assistant"
    assert "Fake summary of the conversation so far." in second.messages[1]["content"]
    assert second.messages[2]["content"].startswith("Continue if you have next steps")
    # one assistant chat message per step of the session, none lost or doubled
    steps = sum(1 for m in stored if m.role == "assistant")
    replies = [m for t in (first, second) for m in t.messages if m["role"] == "assistant"]
    assert len(replies) == steps


def test_an_interrupted_tool_and_an_old_multi_step_message(fixture_db: Path) -> None:
    from memory.opencode_history import StoredMessage

    running = _tool("bash", "call_x", {"status": "running", "input": {"command": "sleep 9"}})
    old = StoredMessage(
        "msg_old",
        {"role": "assistant", "providerID": "anthropic", "modelID": "claude-3-5-haiku-20241022"},
        (
            {"type": "step-start"},
            {"type": "text", "text": "first step"},
            {"type": "step-start"},
            running,
            {"type": "step-start"},  # a step that failed before it said anything
        ),
    )
    with OpenCodeHistory(fixture_db) as history:
        session = history.session(APP)
    [transcript] = session_transcripts(session, [old])
    assert (
        transcript.dialect == "anthropic"
        and transcript.model == "anthropic/claude-3-5-haiku-20241022"
    )
    assert transcript.messages == [
        {"role": "assistant", "content": "first step"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "sleep 9"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_x", "content": INTERRUPTED},
    ]


def test_last_and_named_sessions(agent_db: Path) -> None:
    assert [t.name for t in load_sessions(agent_db, last=2)] == ["ses_openai", "ses_local"]
    assert [t.name for t in load_sessions(agent_db, ["ses_local", "ses_anthropic"])] == [
        "ses_local",
        "ses_anthropic",
    ]


# ---------------------------------------------------------------- the command


def test_replay_opencode_reports_savings_in_each_providers_dialect(
    agent_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(agent_db)
    html = tmp_path / "report.html"
    result = replay(capsys, tmp_path, "--opencode", str(agent_db), "--json", "--html", str(html))
    assert result.code == 0, result.err
    report = result.json
    transcripts = {t["name"]: t for t in report["transcripts"]}
    assert list(transcripts) == list(SESSIONS)  # the last 5 by default, oldest first
    assert {name: t["dialect"] for name, t in transcripts.items()} == {
        "ses_anthropic": "anthropic",
        "ses_openai": "responses",
        "ses_local": "chat",
    }
    for name, transcript in transcripts.items():
        provider, model = SESSIONS[name]
        assert transcript["model"] == f"{provider}/{model}"
        totals = transcript["totals"]
        assert totals["requests"] == STEPS + 1  # one per assistant step
        assert totals["tokens_proxied"] < totals["tokens_original"]  # old reads compressed
        assert totals["pairing_errors"] == 0
        assert {"savings_anthropic", "savings_openai", "money_saved"} <= totals.keys()

    sonnet = DEFAULT.lookup("claude-sonnet-4-5")
    anthropic = transcripts["ses_anthropic"]
    assert anthropic["price"]["pattern"] == "claude-sonnet-4*"
    expected = sum(
        sonnet.input_cost(r["tokens_original"], r["cached_original"])
        - sonnet.input_cost(r["tokens_proxied"], r["cached_proxied"])
        for r in anthropic["requests"]
    )
    assert anthropic["totals"]["priced_requests"] == STEPS + 1
    assert anthropic["totals"]["money_saved"] == pytest.approx(expected)
    assert transcripts["ses_openai"]["price"]["pattern"] == "gpt-5"
    local = transcripts["ses_local"]
    assert local["price"] is None and local["totals"]["priced_requests"] == 0
    assert local["totals"]["money_original"] == 0 and local["totals"]["unpriced_requests"] > 0
    total = report["total"]
    assert total["priced_requests"] == 2 * (STEPS + 1)
    assert total["models"] == sorted(f"{p}/{m}" for p, m in SESSIONS.values())

    page = parse(html.read_text(encoding="utf-8"))
    summary = {name: dict(pairs) for name, pairs in page.summary.items()}
    assert (
        float(summary["ses_anthropic"]["money_original"]) == anthropic["totals"]["money_original"]
    )
    assert "money_original" not in summary["ses_local"]  # no price: a dash, token units only
    assert float(summary["ses_local"]["savings_anthropic"]) == local["totals"]["savings_anthropic"]
    assert float(summary["TOTAL"]["money_proxied"]) == total["money_proxied"]
    document = html.read_text(encoding="utf-8")
    for dialect in ("anthropic", "responses", "chat"):
        assert document.count(f"data-dialect='{dialect}'") == 1
    assert snapshot(agent_db) == before  # read, never written


def test_replay_opencode_text_names_money_and_unpriced_models(
    agent_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = replay(
        capsys,
        tmp_path,
        "--opencode",
        str(agent_db),
        "--session",
        "ses_anthropic",
        "--session",
        "ses_local",
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0] == "dialect: anthropic, chat"
    assert "$ saved" in lines[1]
    row = next(line for line in lines if line.startswith("ses_anthropic"))
    assert "$" in row
    assert next(line for line in lines if line.startswith("ses_local")).split()[8] == "-"
    assert any(
        line.startswith("at list prices: ") and "anthropic/claude-sonnet-4-5-20250929" in line
        for line in lines
    )
    assert "no price (token units only, the anthr./openai columns): ollama/qwen3-coder:30b" in lines
    forced = replay(
        capsys,
        tmp_path,
        "--opencode",
        str(agent_db),
        "--last",
        "1",
        "--dialect",
        "anthropic",
        "--json",
    )
    assert [t["dialect"] for t in forced.json["transcripts"]] == ["anthropic"]


def test_the_default_database_is_opencodes_own(
    agent_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data_home = tmp_path / "xdg"
    (data_home / "opencode").mkdir(parents=True)
    (data_home / "opencode" / "opencode.db").write_bytes(agent_db.read_bytes())
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    result = replay(capsys, tmp_path, "--opencode", "--last", "1", "--json")
    assert result.code == 0, result.err
    assert [t["name"] for t in result.json["transcripts"]] == ["ses_local"]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        ([], 2, "give a transcript FILE|DIR, or --opencode"),
        (["somewhere.json", "--opencode"], 2, "not both"),
        (["--opencode", "DB", "--session", "s", "--last", "2"], 2, "--session or --last"),
        (["x.json", "--last", "2"], 2, "go with --opencode"),
        (["--opencode", "DB", "--session", "ses_missing"], 1, "no session 'ses_missing'"),
        (["--opencode", "/nonexistent/opencode.db"], 1, "/nonexistent/opencode.db"),
    ],
)
def test_usage_errors_and_unreadable_databases(
    argv: list[str],
    code: int,
    message: str,
    agent_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [str(agent_db) if arg == "DB" else arg for arg in argv]
    result = replay(capsys, tmp_path, *argv)
    assert result.code == code
    assert message in result.err and "Traceback" not in result.err
