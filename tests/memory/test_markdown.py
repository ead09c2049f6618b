"""The one memory Markdown grammar, and that search and the store read files the same way.

Each test pins a point where ``memory.search`` and ``memory.store`` used to parse differently.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory import markdown
from memory.search import parse_documents
from memory.store import SECTIONS, MemoryFile, MemoryStore


def _search(text: str) -> list[tuple[str, str, int, date | None]]:
    """(section title, entry text, line, date) for every search entry."""
    return [
        (doc.title, entry.text, entry.line, entry.date)
        for doc in parse_documents("MEMORY.md", text)
        for entry in doc.entries
    ]


def _store(text: str) -> list[tuple[str, str, str | None]]:
    """(section, text, date) for every store entry."""
    return [(e.section, e.text, e.date) for e in MemoryFile.parse(text).entries()]


# --------------------------------------------------------------------------- lines


def test_lines_split_on_newline_only() -> None:
    """U+2028, U+0085 and form feeds are text, not line breaks (``splitlines`` split them)."""
    text = "## Facts\n- a\u2028b\x0cc\x85d [2025-01-02]\n- next [2025-01-03]\n"
    assert _search(text) == [
        ("Facts", "a\u2028b\x0cc\x85d", 2, date(2025, 1, 2)),
        ("Facts", "next", 3, date(2025, 1, 3)),
    ]
    assert _store(text) == [
        ("Facts", "a\u2028b\x0cc\x85d", "2025-01-02"),
        ("Facts", "next", "2025-01-03"),
    ]
    assert MemoryFile.parse(text).render() == text


def test_crlf_lines_and_numbers_match_lf() -> None:
    lf = "# Memory\n\n## Decisions\n- use x [2025-01-02]\n\n## Facts\n- y\n"
    crlf = lf.replace("\n", "\r\n")
    assert markdown.split_lines(crlf) == markdown.split_lines(lf)
    assert _search(crlf) == _search(lf)
    assert parse_documents("MEMORY.md", crlf)[1].text == "- y"
    assert _store(crlf) == _store(lf)
    assert MemoryFile.parse(crlf).render() == crlf


# --------------------------------------------------------------------------- headings


def test_heading_closing_hashes_are_dropped_only_after_whitespace() -> None:
    text = "## Decisions ##\n- use x\n\n## C#\n- sharp\n\n## Facts # \n- y\n##\tNotes\n- z\n"
    docs = parse_documents("MEMORY.md", text)
    assert [d.title for d in docs] == ["Decisions", "C#", "Facts", "Notes"]
    assert [d.line for d in docs] == [1, 4, 7, 9]
    assert _store(text) == [
        ("Decisions", "use x", None),
        ("Facts", "y", None),
        ("Notes", "z", None),
    ]


def test_heading_needs_whitespace_and_level_two() -> None:
    text = "## Facts\n- a\n##Notes\n### Sub\n- b\n## \n- c\n"
    sections = markdown.parse(text)
    assert [s.title for s in sections] == [None, "Facts", ""]
    # `##Notes` is text, `### Sub` is a sub-heading: neither starts a section
    assert [d.title for d in parse_documents("MEMORY.md", text)] == ["Facts", ""]
    # an empty `## ` heading starts a section of its own, so `- c` is no Fact
    assert _store(text) == [("Facts", "a", None), ("Facts", "b", None)]


def test_other_headings_are_not_entries_but_hashtags_are() -> None:
    text = "## Notes\n- bullet\n  ### not a continuation\n#tag is text\n#\n"
    assert _search(text) == [("Notes", "bullet", 2, None), ("Notes", "#tag is text", 4, None)]
    preamble = "# Checkpoint — x\n\n## User Intent\nship it\n"
    assert [d.title for d in parse_documents("checkpoint.md", preamble)] == ["User Intent"]
    assert [d.title for d in parse_documents("checkpoint.md", "#1 first\n")] == [""]


# --------------------------------------------------------------------------- bullets


def test_ordered_list_items_are_bullets_in_both() -> None:
    text = "## Decisions\n1. use x [2025-01-02]\n2) use y\n1.5 GB is not a bullet\n+ z\n* w\n"
    assert [e[1] for e in _search(text)] == ["use x", "use y", "1.5 GB is not a bullet", "z", "w"]
    assert _store(text) == [
        ("Decisions", "use x", "2025-01-02"),
        ("Decisions", "use y", None),
        ("Decisions", "z", None),
        ("Decisions", "w", None),
    ]


def test_empty_bullets_are_not_entries() -> None:
    text = "## Facts\n-\n- \n*\n- real\n"
    assert _search(text) == [("Facts", "real", 5, None)]
    assert _store(text) == [("Facts", "real", None)]
    assert MemoryFile.parse(text).render() == text


def test_continuation_lines_join_in_search_and_go_with_the_entry_in_the_store() -> None:
    """Search joins a bullet's indented continuation lines; the store keeps the bullet line as
    the entry's text (tests/memory/test_store.py pins that) but removes them with it."""
    text = "## Facts\n- first\n  more [2025-01-02]\n- second\n"
    assert _search(text) == [
        ("Facts", "first more", 2, date(2025, 1, 2)),
        ("Facts", "second", 4, None),
    ]
    doc = MemoryFile.parse(text)
    first, second = doc.entries()
    assert (first.text, second.text) == ("first", "second")
    assert doc.remove({first.id}) == [first]
    assert doc.render() == "## Facts\n- second\n"


def test_forget_takes_continuation_lines_along(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    text = "## Gotchas\n- keep me\n- drop me\n  dropped too\n- also kept\n  kept too\n"
    store.memory_path.write_text(text, encoding="utf-8")
    assert store.forget("drop me", confirm=True).count == 1
    after = store.memory_path.read_text(encoding="utf-8")
    assert after == "## Gotchas\n- keep me\n- also kept\n  kept too\n"
    assert _search(after)[1] == ("Gotchas", "also kept kept too", 3, None)


# --------------------------------------------------------------------------- dates


@pytest.mark.parametrize(
    ("body", "text", "when"),
    [
        ("x [2025-02-03]", "x", date(2025, 2, 3)),
        ("x[2025-02-03]  ", "x", date(2025, 2, 3)),
        ("x [2025-13-45]", "x [2025-13-45]", None),  # not a calendar date: stays text
        ("x [2025-02-30]", "x [2025-02-30]", None),
        ("[2025-02-03]", "[2025-02-03]", None),  # a tag alone is the text
        ("x [2025-02-03] y", "x [2025-02-03] y", None),
        ("x [２０２５-02-03]", "x [２０２５-02-03]", None),
    ],
)
def test_date_tags(body: str, text: str, when: date | None) -> None:
    assert markdown.split_date(body) == (text, when)
    doc = f"## Facts\n- {body}\n"
    assert _search(doc) == [("Facts", text, 2, when)]
    assert _store(doc) == [("Facts", text, when.isoformat() if when else None)]


def test_leading_date_of_notes_headings() -> None:
    assert markdown.leading_date("2025-05-28T09:12:00Z (session ab12cd34) [1f2e3d4c]") == date(
        2025, 5, 28
    )
    assert markdown.leading_date("2025-05-28") == date(2025, 5, 28)
    assert markdown.leading_date("2025-02-30T00:00:00Z") is None
    assert markdown.leading_date("Decisions") is None


def test_note_hashes_come_from_headings(tmp_path: Path) -> None:
    store = MemoryStore(tmp_path)
    store.notes_path.write_text(
        "## 2025-01-01T00:00:00Z (session a) [0123abcd]\r\n"
        "body mentions [deadbeef] but is no heading\r\n"
        "### 2025-01-01T00:00:00Z (session a) [feedface]\r\n",
        encoding="utf-8",
    )
    assert store.stats()["notes"] == 1


# --------------------------------------------------------------------------- properties

_LINES = st.lists(
    st.sampled_from(
        [
            "",
            "   ",
            "# Memory",
            "## Decisions",
            "## Facts ##",
            "## Links",
            "## ",
            "### Sub",
            "- use sqlite [2025-01-02]",
            "- 使用 SQLite 存储 [2025-02-03]",
            "* star bullet",
            "1. numbered [2025-13-01]",
            "-",
            "  - nested bullet",
            "prose line",
            "a\u2028b",
            "#tag",
        ]
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(lines=_LINES, crlf=st.booleans())
def test_round_trip_and_callers_agree(lines: list[str], crlf: bool) -> None:
    newline = "\r\n" if crlf else "\n"
    text = "".join(line + newline for line in lines)
    assert markdown.split_lines(text) == lines
    assert MemoryFile.parse(text).render() == text
    # without continuation lines, the store's entries are exactly search's bullets
    # in the store's sections
    bullets = [
        (title, entry, when.isoformat() if when else None)
        for title, entry, number, when in _search(text)
        if title in SECTIONS and lines[number - 1].lstrip()[:1] in ("-", "*", "1")
    ]
    assert _store(text) == bullets


def test_stray_carriage_return_in_lf_file_is_kept() -> None:
    text = "## Facts\n- a [2025-01-02]\r"  # no CRLF line break: the file is LF
    assert markdown.split_lines(text) == ["## Facts", "- a [2025-01-02]\r"]
    assert _store(text) == [("Facts", "a", "2025-01-02")]
    assert _search(text) == [("Facts", "a", 2, date(2025, 1, 2))]
    assert MemoryFile.parse(text).render() == text + "\n"
