"""Keyword captures and nudge triggers, in English and Chinese."""

from __future__ import annotations

import pytest

from memory.signals import MAX_CAPTURE_CHARS, capture, nudge_reasons


@pytest.mark.parametrize(
    "text",
    [
        "Remember: the staging DB is read-only",
        "Don't forget to bump the version",
        "important: never push to main",
        "From now on use pnpm",
        "You must not edit generated files",
        "记住：测试前先启动 redis",
        "别忘了更新 CHANGELOG",
        "重要：接口不能改名",
        "绝不能删除迁移文件",
    ],
)
def test_capture_keeps_what_the_user_asked_to_remember(text):
    assert capture(text) == text


@pytest.mark.parametrize(
    "text",
    ["list the files", "Do you remember the port?", "", "修复这个测试", "I misremember things"],
)
def test_capture_ignores_ordinary_text(text):
    assert capture(text) is None


def test_long_messages_keep_only_the_keyword_sentences():
    filler = "This sentence is only context. " * 100
    kept = capture(filler + "Remember that the cache lives in /var/cache/app. " + filler)
    assert kept == "Remember that the cache lives in /var/cache/app."
    assert len(capture("remember " + "x" * 10_000) or "") <= MAX_CAPTURE_CHARS


def test_nudge_reasons_find_decisions_constraints_and_fixes():
    signals = nudge_reasons(
        [
            "Looked around. We decided to use SQLite for the queue. It is simpler.",
            "以后禁止直接修改 vendor 目录。",
            "问题出在时区转换上，已经修复了。",
        ]
    )
    assert [(s.kind, s.section) for s in signals] == [
        ("decision", "Decisions"),
        ("constraint", "Constraints"),
        ("fix", "Gotchas"),
    ]
    assert signals[0].excerpt == "We decided to use SQLite for the queue."
    assert nudge_reasons(["Read the file and ran the tests."]) == []
