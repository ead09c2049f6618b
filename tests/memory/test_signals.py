"""Keyword captures and nudge triggers, in English and Chinese."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory import signals
from memory.signals import MAX_CAPTURE_CHARS, capture, keyword_pattern, nudge_reasons


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


# The patterns as they were written before ``keyword_pattern`` gated them by their first letters.
PLAIN = {
    "capture": r"\b(?:remember|don'?t\s+forget|do\s+not\s+forget|keep\s+in\s+mind|note\s+to\s+self|"
    r"must\s+not|must\s+never|never\s+ever|from\s+now\s+on)\b|\bimportant\s*:"
    r"|记住|记得|别忘|不要忘|重要[:\uff1a]|绝不能|千万不要|务必|以后都|从现在起",
    "decision": r"\b(?:we|i)\s+(?:have\s+|'ve\s+)?"
    r"(?:decided|chose|agreed|settled\s+on|went\s+with)\b"
    r"|\b(?:let'?s|we'?ll|we\s+will)\s+(?:use|go\s+with|switch\s+to|stick\s+with)\b"
    r"|\bdecision\s*:|决定|选择了|采用|改用|就用",
    "constraint": r"\b(?:must\s+not|must\s+never|never\s+use|always\s+use|do\s+not\s+use|"
    r"don'?t\s+use|"
    r"is\s+not\s+allowed|are\s+not\s+allowed|is\s+required\s+to)\b"
    r"|必须|不能用|不允许|禁止|不要用",
    "fix": r"\b(?:the\s+fix\s+(?:was|is)|root\s+cause|the\s+(?:problem|issue|bug)\s+was|"
    r"(?:was|is)\s+caused\s+by|fixed\s+(?:it|this|the)\s+by|resolved\s+by)\b"
    r"|修复了|原因是|根本原因|问题出在|解决了",
}
GATED = {
    "capture": signals._CAPTURE_KEYWORDS,
    **{kind: pattern for kind, _, pattern in signals.SIGNAL_PATTERNS},
}
FRAGMENTS = [
    "remember",
    "don't",
    "dont",
    "forget",
    "do",
    "not",
    "keep",
    "in",
    "mind",
    "note",
    "to",
    "self",
    "must",
    "never",
    "ever",
    "from",
    "now",
    "on",
    "important:",
    "we",
    "i",
    "have",
    "'ve",
    "decided",
    "chose",
    "agreed",
    "settled",
    "went",
    "with",
    "let's",
    "lets",
    "we'll",
    "well",
    "will",
    "use",
    "go",
    "switch",
    "to",
    "stick",
    "decision:",
    "always",
    "allowed",
    "are",
    "is",
    "required",
    "the",
    "fix",
    "was",
    "root",
    "cause",
    "problem",
    "issue",
    "bug",
    "caused",
    "by",
    "fixed",
    "it",
    "this",
    "resolved",
    "记住",
    "记得",
    "别忘",
    "不要忘",
    "重要：",
    "绝不能",
    "千万不要",
    "务必",
    "以后都",
    "从现在起",
    "决定",
    "选择了",
    "采用",
    "改用",
    "就用",
    "必须",
    "不能用",
    "不允许",
    "禁止",
    "不要用",
    "修复了",
    "原因是",
    "根本原因",
    "问题出在",
    "解决了",
]


@given(
    st.lists(
        st.one_of(
            st.sampled_from(FRAGMENTS).map(lambda word: word.upper() if len(word) > 5 else word),
            st.text(alphabet=" \n\t.,:'_-aAiIsSſİK记重", max_size=4),
        ),
        max_size=25,
    ).map(" ".join),
    st.sampled_from(sorted(PLAIN)),
)
def test_a_gated_keyword_pattern_finds_what_the_plain_alternation_finds(text, kind):
    """The first-letter gate only skips positions where no alternative can begin: every search
    starts where the plain pattern's does (capture and nudges use the start only)."""
    plain = re.compile(PLAIN[kind], re.IGNORECASE)
    assert [m.start() for m in GATED[kind].finditer(text)] == [
        m.start() for m in plain.finditer(text)
    ]


def test_a_keyword_alternative_must_begin_with_a_letter():
    with pytest.raises(ValueError, match="begin with a letter"):
        keyword_pattern((), (r"\b(?:we|i)\s+decided\b",))
