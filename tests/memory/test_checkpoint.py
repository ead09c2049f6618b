"""Checkpoints: extraction from all three wire formats and from OpenCode's compaction
transcript, the Markdown round trip, and the resume digest within a budget."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from compressors.tokens import estimate_tokens
from compressors.view import Dialect
from compressors.wire import parse_conversation
from memory.checkpoint import (
    Checkpoint,
    classify,
    essentials,
    extract,
    extract_transcript,
    transcript_messages,
)
from tests.conftest import CAPTURES, CORPUS

WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)

# A neutral script of a session: ("user", text), ("assistant", text),
# ("call", tool name, arguments, result text). `_body` turns it into each wire format.
Script = list[tuple[Any, ...]]

ENGLISH: Script = [
    (
        "user",
        "Add a --verbose flag to the CLI in src/cli.py. Always run the tests with pytest -q. "
        "Never edit generated files under build/.",
    ),
    ("assistant", "We decided to use argparse instead of click for the new flag."),
    ("call", "read", {"filePath": "src/cli.py"}, "1: import argparse\n2: def main(): ..."),
    (
        "call",
        "bash",
        {"command": "pytest -q"},
        'Traceback (most recent call last):\n  File "src/cli.py", line 9, in main\n'
        "    if verbose:\nNameError: name 'verbose' is not defined\n",
    ),
    ("call", "edit", {"filePath": "src/cli.py", "oldString": "a", "newString": "b"}, "OK"),
    ("call", "bash", {"command": "pytest -q"}, "3 passed in 0.12s"),
    ("call", "read", {"filePath": "src/cli.py"}, "1: import argparse"),
    ("call", "bash", {"command": "mv notes.txt docs/notes.txt && rm -rf tmp"}, ""),
    ("call", "bash", {"command": "ls -la 2>/dev/null | head -5"}, "total 0"),
    ("call", "write", {"filePath": "docs/usage.md", "content": "# Usage\n"}, "Wrote file"),
    (
        "call",
        "apply_patch",
        {"input": "*** Begin Patch\n*** Add File: src/flags.py\n+X = 1\n*** End Patch"},
        "Done",
    ),
    ("call", "edit", {"filePath": "src/cli.py", "oldString": "b", "newString": "c"}, "OK"),
    ("assistant", "The root cause was that `verbose` was never passed to `main()`."),
    ("user", "What did we do so far?"),
    (
        "user",
        '<deep-memory-context kind="recall">\n- (Decisions) old stuff\n</deep-memory-context>\n'
        "Now document the flag in README.md.",
    ),
    ("call", "read", {"filePath": "README.md"}, "# Demo"),
    ("call", "read", {"filePath": "src/cli.py"}, "1: import argparse"),
]

CHINESE: Script = [
    ("user", "给项目加上缓存层。不要修改数据库表结构。必须保持接口向后兼容。"),
    ("assistant", "我们决定采用 Redis 作为缓存后端，这样部署最简单。"),
    (
        "call",
        "bash",
        {"command": "python -m pytest"},
        "错误：连接 Redis 失败 (ConnectionRefused)\n",
    ),
    ("call", "read", {"filePath": "config/settings.py"}, "REDIS_PORT = 6380"),
    ("call", "edit", {"filePath": "config/settings.py", "oldString": "6380"}, "编辑成功"),
    ("assistant", "问题出在配置文件里的 Redis 端口写错了，已改为 6379。"),
    ("call", "bash", {"command": "mkdir -p cache && touch cache/.keep"}, ""),
    ("user", "很好。以后都用中文写提交信息。"),
]


def _body(dialect: Dialect, script: Script) -> dict[str, Any]:
    """The request body of one wire format that carries ``script``."""
    if dialect is Dialect.OPENAI_CHAT:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coder."}]
        for n, step in enumerate(script):
            if step[0] == "call":
                _, name, args, result = step
                call = {"id": f"c{n}", "type": "function"}
                call["function"] = {"name": name, "arguments": json.dumps(args)}
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": result})
            else:
                messages.append({"role": step[0], "content": step[1]})
        return {"model": "m", "messages": messages, "tools": [{"type": "function"}]}
    if dialect is Dialect.ANTHROPIC:
        messages = []
        for n, step in enumerate(script):
            if step[0] == "call":
                _, name, args, result = step
                use = {"type": "tool_use", "id": f"t{n}", "name": name, "input": args}
                messages.append({"role": "assistant", "content": [use]})
                answer = {"type": "tool_result", "tool_use_id": f"t{n}", "content": result}
                messages.append({"role": "user", "content": [answer]})
            else:
                messages.append({"role": step[0], "content": [{"type": "text", "text": step[1]}]})
        return {"model": "m", "system": "You are a coder.", "messages": messages}
    items: list[dict[str, Any]] = []
    for n, step in enumerate(script):
        if step[0] == "call":
            _, name, args, result = step
            call = {"type": "function_call", "call_id": f"f{n}", "name": name}
            items.append({**call, "arguments": json.dumps(args)})
            items.append({"type": "function_call_output", "call_id": f"f{n}", "output": result})
        else:
            kind = "input_text" if step[0] == "user" else "output_text"
            content = [{"type": kind, "text": step[1]}]
            items.append({"type": "message", "role": step[0], "content": content})
    return {"model": "m", "instructions": "You are a coder.", "input": items}


def _extract(dialect: Dialect, script: Script) -> Checkpoint:
    return extract(parse_conversation(dialect, _body(dialect, script)), "ses_test", WHEN)


# ---------------------------------------------------------------- hand-built sessions


def test_english_session() -> None:
    checkpoint = _extract(Dialect.OPENAI_CHAT, ENGLISH)
    assert checkpoint.message_count == 1 + sum(2 if step[0] == "call" else 1 for step in ENGLISH)
    assert checkpoint.intents[0].startswith("Add a --verbose flag to the CLI")
    assert checkpoint.intents[1:] == ["Now document the flag in README.md."]
    assert checkpoint.decisions == ["We decided to use argparse instead of click for the new flag."]
    assert checkpoint.constraints == [
        "Always run the tests with pytest -q.",
        "Never edit generated files under build/.",
    ]
    assert checkpoint.gotchas == [
        "NameError: name 'verbose' is not defined → fixed by editing src/cli.py",
        "The root cause was that `verbose` was never passed to `main()`.",
    ]
    assert checkpoint.file_changes == [
        "edited src/cli.py (2×)",
        "ran: mv notes.txt docs/notes.txt && rm -rf tmp",
        "wrote docs/usage.md",
        "created src/flags.py",
    ]
    assert checkpoint.files_read == [("src/cli.py", 3), ("README.md", 1)]


def test_chinese_session() -> None:
    checkpoint = _extract(Dialect.OPENAI_CHAT, CHINESE)
    assert checkpoint.intents == [
        "给项目加上缓存层。不要修改数据库表结构。必须保持接口向后兼容。",
        "很好。以后都用中文写提交信息。",
    ]
    assert checkpoint.constraints == ["不要修改数据库表结构。", "必须保持接口向后兼容。"]
    assert checkpoint.decisions == ["我们决定采用 Redis 作为缓存后端，这样部署最简单。"]
    assert checkpoint.gotchas == [
        "错误：连接 Redis 失败 (ConnectionRefused) → fixed by editing config/settings.py",
        "问题出在配置文件里的 Redis 端口写错了，已改为 6379。",
    ]
    assert checkpoint.file_changes == [
        "edited config/settings.py",
        "ran: mkdir -p cache && touch cache/.keep",
    ]
    assert checkpoint.files_read == [("config/settings.py", 1)]


@pytest.mark.parametrize("script", [ENGLISH, CHINESE], ids=["english", "chinese"])
@pytest.mark.parametrize("dialect", [Dialect.ANTHROPIC, Dialect.OPENAI_RESPONSES])
def test_every_dialect_extracts_the_same(dialect: Dialect, script: Script) -> None:
    expected = _extract(Dialect.OPENAI_CHAT, script)
    found = _extract(dialect, script)
    found.message_count = expected.message_count
    assert found == expected


def test_an_error_without_a_following_edit_is_no_gotcha() -> None:
    script: Script = [
        ("user", "Run the tests."),
        ("call", "bash", {"command": "pytest"}, "FAILED tests/test_a.py::test_x - assert 1 == 2"),
        ("call", "bash", {"command": "git status"}, "clean"),
        ("call", "read", {"filePath": "a.py"}, "x"),
        ("call", "read", {"filePath": "b.py"}, "y"),
        ("call", "edit", {"filePath": "a.py"}, "ok"),
    ]
    assert _extract(Dialect.OPENAI_CHAT, script).gotchas == []
    script[2] = ("call", "edit", {"filePath": "tests/test_a.py"}, "ok")
    script[3] = ("call", "edit", {"filePath": "a.py"}, "ok")
    assert _extract(Dialect.OPENAI_CHAT, script).gotchas == [
        "FAILED tests/test_a.py::test_x - assert 1 == 2 → fixed by editing tests/test_a.py, a.py"
    ]


def test_errors_in_file_contents_are_not_gotchas() -> None:
    script: Script = [
        ("user", "Look at the handler."),
        ("call", "read", {"filePath": "h.py"}, "1: raise ValueError('Error: bad')\n"),
        ("call", "bash", {"command": "grep -n Error h.py"}, "1: Error: bad\n"),
        ("call", "edit", {"filePath": "h.py"}, "ok"),
    ]
    assert _extract(Dialect.OPENAI_CHAT, script).gotchas == []


@pytest.mark.parametrize(
    ("result", "line"),
    [
        ("bash: foo: command not found\n", "bash: foo: command not found"),
        ("cat: x.txt: No such file or directory", "cat: x.txt: No such file or directory"),
        ("ok\n[Command finished with exit code 2]", "`make build` exited with code 2"),
        ("src/a.ts(3,1): error TS2304: Cannot find name 'x'.", "src/a.ts(3,1): error TS2304"),
        ("===== 1 failed, 3 passed in 0.2s =====", "===== 1 failed, 3 passed in 0.2s ====="),
        ("构建失败：缺少依赖 numpy", "构建失败：缺少依赖 numpy"),
    ],
)
def test_error_lines(result: str, line: str) -> None:
    script: Script = [
        ("user", "Build it."),
        ("call", "bash", {"command": "make build"}, result),
        ("call", "edit", {"filePath": "Makefile"}, "ok"),
    ]
    (gotcha,) = _extract(Dialect.OPENAI_CHAT, script).gotchas
    assert gotcha.startswith(line)
    assert gotcha.endswith("→ fixed by editing Makefile")


@pytest.mark.parametrize(
    ("command", "changes"),
    [
        ("cat > setup.cfg <<'EOF'\n[tool]\nrm = 1\nEOF", True),
        ("python run.py > out.txt", True),
        ("sed -i 's/a/b/' x.py", True),
        ("git mv a.py b.py", True),
        ("cd /repo && cp a b", True),
        ("echo 'a > b' && ls 2>/dev/null", False),
        ('python -c "print(1 > 0)" 2>&1 | tail -3', False),
        ("git status && git diff", False),
        # read with compressors.vocabulary.shell_steps: wrappers, comments, pipes into xargs
        ("timeout 60 rm -rf build", True),
        ("find . -name '*.pyc' | xargs rm", True),
        ("ls # then; rm x", False),
    ],
)
def test_shell_commands_that_change_files(command: str, changes: bool) -> None:
    script: Script = [("user", "Go."), ("call", "bash", {"command": command}, "")]
    found = _extract(Dialect.OPENAI_CHAT, script).file_changes
    assert bool(found) is changes
    if changes:
        assert found[0].startswith("ran: ")
        assert "\n" not in found[0]


def test_shell_reads_leave_out_redirections_and_codex_argv_lists_count() -> None:
    script: Script = [
        ("user", "Look."),
        ("call", "bash", {"command": "cat a.py 2>/dev/null"}, "x"),
        ("call", "shell", {"command": ["bash", "-lc", "sed -i 's/a/b/' b.py"]}, ""),
        ("call", "shell", {"command": ["bash", "-lc", "head -n 5 c.py"]}, "x"),
    ]
    checkpoint = _extract(Dialect.OPENAI_CHAT, script)
    assert checkpoint.files_read == [("a.py", 1), ("c.py", 1)]
    assert checkpoint.file_changes == ["ran: sed -i 's/a/b/' b.py"]


def test_editor_tools_and_open_file() -> None:
    script: Script = [
        ("user", "Fix it."),
        ("call", "str_replace_editor", {"command": "view", "path": "/r/a.py"}, "1\tx"),
        ("call", "str_replace_editor", {"command": "create", "path": "/r/t.py"}, "created"),
        ("call", "str_replace_editor", {"command": "str_replace", "path": "/r/a.py"}, "ok"),
        ("call", "str_replace_editor", {"command": "insert", "path": "/r/a.py"}, "ok"),
        ("call", "open", {"path": "b.py"}, "1:x\n(Open file: /r/b.py)\n(Current directory: /r)"),
        ("call", "edit", {"search": "x", "replace": "y"}, "(Open file: /r/b.py)"),
        ("call", "MultiEdit", {"file_path": "/r/c.py", "edits": []}, "ok"),
        ("call", "bash", {"command": "cat /r/a.py | head -3"}, "x"),
    ]
    checkpoint = _extract(Dialect.OPENAI_CHAT, script)
    assert checkpoint.file_changes == [
        "created /r/t.py",
        "edited /r/a.py (2×)",
        "edited /r/b.py",
        "edited /r/c.py",
    ]
    assert checkpoint.files_read == [("/r/a.py", 2), ("/r/b.py", 1)]


def test_lists_are_limited_and_deduplicated() -> None:
    script: Script = [("user", f"Task number {n}.") for n in range(30)]
    script += [("user", "task number 29")]
    script += [("call", "edit", {"filePath": f"f{n}.py"}, "ok") for n in range(25)]
    script += [("call", "read", {"filePath": f"r{n}.py"}, "x") for n in range(12)]
    checkpoint = _extract(Dialect.OPENAI_CHAT, script)
    assert len(checkpoint.intents) == 20
    assert checkpoint.intents[0] == "Task number 0."
    assert checkpoint.intents[-1] == "Task number 29."
    assert checkpoint.file_changes == [f"edited f{n}.py" for n in range(5, 25)]
    assert [path for path, _ in checkpoint.files_read] == [f"r{n}.py" for n in range(10)]


def test_intents_are_one_line_and_cut() -> None:
    script: Script = [("user", "line one\nline two " + "x" * 400)]
    (intent,) = _extract(Dialect.OPENAI_CHAT, script).intents
    assert intent.startswith("line one line two x")
    assert len(intent) == 300
    assert intent.endswith("…")


@pytest.mark.parametrize(
    ("sentence", "from_user", "kind"),
    [
        ("Never commit directly to main.", True, "constraint"),
        ("Never commit directly to main.", False, None),
        ("We must not log tokens.", False, "constraint"),
        ("Let's go with SQLite for the cache.", False, "decision"),
        ("Let's use find_file to see where it is.", False, None),
        ("The fix is straightforward.", False, None),
        ("The fix was to pin `urllib3<2`.", False, "fix"),
        ("别用全局变量。", True, "constraint"),
        ("改用 uv 管理依赖。", False, "decision"),
        ("It must have worked.", True, None),
    ],
)
def test_classify(sentence: str, from_user: bool, kind: str | None) -> None:
    assert classify(sentence, from_user) == kind


# ---------------------------------------------------------------- captures and corpus


def _capture(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / f"opencode-1.18.33-{name}.json").read_text())["body"]


@pytest.mark.parametrize(
    ("name", "dialect", "key"),
    [
        ("openai-compatible-agent-with-tool-results", Dialect.OPENAI_CHAT, "messages"),
        ("anthropic-messages-agent-with-thinking", Dialect.ANTHROPIC, "messages"),
        ("openai-responses-agent-with-reasoning", Dialect.OPENAI_RESPONSES, "input"),
    ],
)
def test_captures(name: str, dialect: Dialect, key: str) -> None:
    body = _capture(name)
    checkpoint = extract(parse_conversation(dialect, body), "ses_capture", WHEN)
    assert checkpoint.message_count == len(body[key])
    assert checkpoint.intents[0] == "List the files in this repo and tell me what README.md says"
    assert checkpoint.files_read == [("/home/dev/demo-repo/README.md", 1)]
    assert checkpoint.file_changes == []
    assert checkpoint.gotchas == []
    assert Checkpoint.parse(checkpoint.render()) == checkpoint


def test_compaction_transcript() -> None:
    text = _capture("openai-compatible-compaction")["messages"][1]["content"]
    checkpoint = extract_transcript(text, "ses_compact", WHEN)
    assert checkpoint.intents == [
        "List the files in this repo and tell me what README.md says",
        "Now also look at hello.py PLEASE-OVERFLOW",
    ]
    assert checkpoint.files_read == [("/home/dev/demo-repo/README.md", 1)]
    assert checkpoint.message_count == 9
    roles = [message["role"] for message in transcript_messages(text)]
    turn = ["assistant", "tool"]
    assert roles == ["user", *turn, *turn, "assistant", "user", *turn]


def test_transcript_with_errors_edits_and_chinese() -> None:
    text = "\n".join(
        [
            "Here is the conversation so far:",
            "<conversation>",
            "[User]: 修复登录接口。不要改动数据库。",
            "",
            "[Assistant]: 我们决定采用 JWT 方案。",
            '[Assistant tool call]: bash({"command":"npm test"})',
            "[Tool result]: FAIL src/login.test.ts",
            "  TypeError: Cannot read properties of undefined (reading 'token')",
            '[Assistant tool call]: edit({"filePath":"/app/src/login.ts","oldString":"a"})',
            "[Tool error]: old_string not found in file",
            '[Assistant tool call]: edit({"filePath":"/app/src/login.ts","oldString":"b"})',
            "[Tool result]: Edit applied successfully.",
            "[User]: [Attached image/png: screenshot.png]",
            "</conversation>",
            "Create a new anchored summary.",
        ]
    )
    checkpoint = extract_transcript(text, "ses_zh", WHEN)
    assert checkpoint.intents[0] == "修复登录接口。不要改动数据库。"
    assert checkpoint.constraints == ["不要改动数据库。"]
    assert checkpoint.decisions == ["我们决定采用 JWT 方案。"]
    assert checkpoint.gotchas == [
        "TypeError: Cannot read properties of undefined (reading 'token') → fixed by editing "
        "/app/src/login.ts",
        "old_string not found in file → fixed by editing /app/src/login.ts",
    ]
    assert checkpoint.file_changes == ["edited /app/src/login.ts (2×)"]


def _corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.json")) if CORPUS.is_dir() else []


@pytest.mark.skipif(not _corpus(), reason="corpus transcripts not available")
@pytest.mark.parametrize("path", _corpus(), ids=lambda path: path.stem)
def test_corpus_transcripts(path: Path) -> None:
    data = json.loads(path.read_text())
    conversation = parse_conversation(Dialect.OPENAI_CHAT, {"messages": data["messages"]})
    checkpoint = extract(conversation, path.stem, WHEN)
    assert checkpoint.message_count == len(data["messages"])
    assert checkpoint.intents
    assert checkpoint.file_changes  # every transcript changes files
    for name in ("intents", "decisions", "constraints", "gotchas", "file_changes"):
        items = getattr(checkpoint, name)
        assert len(items) <= 20
        assert all(item and "\n" not in item for item in items)
    assert len(checkpoint.files_read) <= 10
    counts = [count for _, count in checkpoint.files_read]
    assert counts == sorted(counts, reverse=True)
    assert Checkpoint.parse(checkpoint.render()) == checkpoint


@pytest.mark.skipif(not _corpus(), reason="corpus transcripts not available")
def test_corpus_swe_agent_details() -> None:
    def load(stem: str) -> Checkpoint:
        data = json.loads((CORPUS / f"{stem}.json").read_text())
        body = {"messages": data["messages"]}
        return extract(parse_conversation(Dialect.OPENAI_CHAT, body), stem, WHEN)

    marshmallow = load("sweagent-marshmallow-1867")
    assert "edited /testbed/src/marshmallow/fields.py" in marshmallow.file_changes
    assert "ran: rm reproduce.py" in marshmallow.file_changes
    assert ("/testbed/src/marshmallow/fields.py", 1) in marshmallow.files_read

    treon = load("nebius-treon-25")  # SWE-agent commands run through the bash tool
    assert treon.file_changes[0] == "edited /treon/treon/treon.py (5×)"
    assert any("IndentationError" in gotcha for gotcha in treon.gotchas)

    moto = load("swesmith-moto-pr6055")
    assert moto.files_read[0] == ("/testbed/tests/test_athena/test_athena.py", 5)
    assert any(g.startswith("ImportError: cannot import name 'mock_athena'") for g in moto.gotchas)

    monai = load("oh-swegym-monai-3715")  # OpenHands: exceptions glued to annotations
    assert (
        "ValueError: unsupported mode: train, should be 'eval' or 'train'. → fixed by editing "
        "/workspace/Project-MONAI__MONAI__0.8/monai/engines/evaluator.py"
    ) in monai.gotchas
    assert ("/workspace/Project-MONAI__MONAI__0.8", 1) not in monai.files_read


# ---------------------------------------------------------------- render, parse, essentials


def _full() -> Checkpoint:
    return Checkpoint(
        session_id="ses_abc123",
        captured_at=WHEN,
        message_count=42,
        intents=["Add caching", "给项目加上缓存层"],
        decisions=["Use Redis"],
        constraints=["Never edit build/", "不要修改数据库表结构"],
        gotchas=["NameError: x → fixed by editing a.py"],
        file_changes=["edited a.py (2×)", "ran: rm -rf tmp"],
        files_read=[("a.py", 3), ("dir with space/b (1).py", 1)],
        archive=".deep-memory/sessions/ses_abc123/checkpoint.raw.json",
    )


def test_render_format() -> None:
    checkpoint = Checkpoint("ses_1", WHEN, 3, intents=["Do it"], files_read=[("a.py", 2)])
    assert checkpoint.render() == (
        "# Checkpoint — ses_1\n"
        "Captured 2026-03-04T05:06:07+00:00, 3 messages\n"
        "\n## User Intent\n\n- Do it\n"
        "\n## Decisions\n\n- (none)\n"
        "\n## Constraints\n\n- (none)\n"
        "\n## Gotchas\n\n- (none)\n"
        "\n## File Changes\n\n- (none)\n"
        "\n## Files Read\n\n- a.py (2×)\n"
    )
    assert "full history: x.json" in Checkpoint("s", WHEN, 1, archive="x.json").render()


def test_render_parse_round_trip() -> None:
    full = _full()
    assert Checkpoint.parse(full.render()) == full
    empty = Checkpoint("ses_empty", WHEN, 0)
    assert Checkpoint.parse(empty.render()) == empty
    assert Checkpoint.parse(full.render().replace("\n", "\r\n")) == full


def test_bullets_are_single_lines_and_times_are_utc() -> None:
    local = datetime(2026, 3, 4, 13, 6, 7, tzinfo=timezone(timedelta(hours=8)))
    checkpoint = Checkpoint("s", local, 1, decisions=["two\nlines"])
    assert checkpoint.captured_at == WHEN
    assert checkpoint.captured_at.tzinfo is UTC
    assert "- two lines\n" in checkpoint.render()
    assert Checkpoint("s", datetime(2026, 3, 4, 5, 6, 7), 1).captured_at == WHEN


def test_parse_rejects_other_text() -> None:
    with pytest.raises(ValueError, match="not a rendered checkpoint"):
        Checkpoint.parse("# Project Memory\n\n## Decisions\n")


@pytest.mark.parametrize("budget", [0, 10, 30, 45, 60, 90, 150, 400, 5000])
def test_essentials_fit_the_budget(budget: int) -> None:
    digest = essentials(_full(), budget)
    assert estimate_tokens(digest) <= budget
    assert digest == essentials(_full(), budget)


def test_essentials_order_and_priority() -> None:
    digest = essentials(_full(), 5000)
    lines = digest.split("\n")
    assert lines[0].startswith("Resuming session ses_abc123")
    assert lines[1:4] == ["User intent, latest first:", "- 给项目加上缓存层", "- Add caching"]
    titles = [line for line in lines if line.endswith(":")]
    assert titles == [
        "User intent, latest first:",
        "Constraints:",
        "Decisions:",
        "Gotchas:",
        "File changes:",
        "Files read:",
    ]
    assert lines[-1] == "- dir with space/b (1).py (1×)"
    small = essentials(_full(), 70)
    assert small.split("\n")[-2:] == ["Constraints:", "- Never edit build/"]
    assert essentials(_full(), 45).split("\n") == [lines[0]]


def test_essentials_shortens_the_last_line() -> None:
    checkpoint = Checkpoint("s", WHEN, 1, intents=["word " * 200])
    digest = essentials(checkpoint, 80)
    assert digest.endswith("…")
    assert 60 < estimate_tokens(digest) <= 80


def test_transcript_blocks_start_as_opencode_writes_them() -> None:
    """``[Label]: `` with its space, at the start of a line: a tool result quoting
    ``[User]:x`` keeps that line (it used to open a user message of its own)."""
    text = (
        "<conversation>\n[User]: check the log\n"
        '[Assistant tool call]: bash({"command":"cat chat.log"})\n'
        "[Tool result]: [User]:hello\n[User]:bye\n"
        "</conversation>"
    )
    messages = transcript_messages(text)
    assert [message["role"] for message in messages] == ["user", "assistant", "tool"]
    assert messages[2]["content"] == "[User]:hello\n[User]:bye"
