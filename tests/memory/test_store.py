"""MEMORY.md / notes.md storage: dedup, hand edits, forget, export/import, cleanup, locking."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest

from memory.files import atomic_write, locked_update
from memory.store import (
    SECTIONS,
    MemoryFile,
    MemoryStore,
    MemoryStoreError,
    entry_id,
)

ROOT = Path(__file__).resolve().parents[2]
DAY = "2026-11-01"
ZH = "使用 SQLite 存储会话状态"
BASE = "We use SQLite to store the session state of the proxy"
NEAR = BASE + " process"  # Jaccard 10/11 = 0.91


@pytest.fixture
def store(tmp_path: Path) -> MemoryStore:
    return MemoryStore(tmp_path / ".deep-memory")


def test_store_english_and_chinese(store: MemoryStore) -> None:
    en = store.store("Decisions", "Use SQLite for session state", DAY)
    zh = store.store("Facts", ZH, DAY)
    assert en.stored and zh.stored
    text = store.memory_path.read_text(encoding="utf-8")
    assert "## Decisions\n\n- Use SQLite for session state [2026-11-01]\n" in text
    assert f"## Facts\n\n- {ZH} [2026-11-01]\n" in text
    assert [(e.section, e.text, e.date) for e in store.list()] == [
        ("Decisions", "Use SQLite for session state", DAY),
        ("Facts", ZH, DAY),
    ]
    assert zh.entry.id == entry_id("Facts", ZH) and len(zh.entry.id) == 8


def test_sections_come_out_in_canonical_order(store: MemoryStore) -> None:
    for section in reversed(SECTIONS):
        assert store.store(section, f"something about {section.lower()} here", DAY).stored
    doc = store.memory_path.read_text(encoding="utf-8")
    positions = [doc.index(f"## {name}") for name in SECTIONS]
    assert positions == sorted(positions)


def test_exact_duplicate_rejected_with_reason(store: MemoryStore) -> None:
    first = store.store("Decisions", "Use SQLite for session state", DAY)
    again = store.store("Gotchas", "  use   sqlite for SESSION state. ", "2026-11-02")
    assert not again.stored
    assert "exact duplicate" in again.reason and first.entry.id in again.reason
    assert again.similar_to == first.entry
    zh_dup = store.store("Facts", ZH, DAY)
    assert zh_dup.stored
    zh_again = store.store("Facts", ZH + "。", DAY)
    assert not zh_again.stored and "exact duplicate" in zh_again.reason
    assert len(store.list()) == 2


def test_near_duplicate_rejected_with_reason(store: MemoryStore) -> None:
    store.store("Decisions", BASE, DAY)
    near = store.store("Decisions", NEAR, DAY)
    assert not near.stored
    assert "near-duplicate" in near.reason and near.score >= 0.85
    different = store.store("Decisions", "Compress tool output with a JSON crusher", DAY)
    assert different.stored

    store.store("Facts", ZH, DAY)
    zh_near = store.store("Facts", "使用SQLite存储会话状态", DAY)  # same words, no spaces
    assert not zh_near.stored and "near-duplicate" in zh_near.reason
    assert zh_near.similar_to is not None and zh_near.similar_to.text == ZH


def test_threshold_is_configurable(tmp_path: Path) -> None:
    strict = MemoryStore(tmp_path / "a", similarity_threshold=0.99)
    strict.store("Facts", BASE, DAY)
    assert strict.store("Facts", NEAR, DAY).stored


def test_invalid_section_and_empty_text(store: MemoryStore) -> None:
    with pytest.raises(MemoryStoreError, match=r"unknown section 'Decision'.*Decisions"):
        store.store("Decision", "x", DAY)
    with pytest.raises(MemoryStoreError, match="empty"):
        store.store("Facts", "   \n ", DAY)
    with pytest.raises(MemoryStoreError, match="unknown section"):
        store.list("decisions")
    assert not store.memory_path.exists()


def test_multiline_text_is_stored_on_one_line(store: MemoryStore) -> None:
    result = store.store("Notes", "first line\nsecond line", DAY)
    assert result.entry.text == "first line second line"
    assert store.list("Notes")[0].text == "first line second line"


HAND_EDITED = (
    "# Project Memory\r\n"
    "Some prose a person wrote at the top.\r\n"
    "\r\n"
    "## Decisions\r\n"
    "<!-- keep this comment -->\r\n"
    "- Use aiohttp for the proxy [2026-10-01]\r\n"
    "- an undated hand-written bullet\r\n"
    "  continuation prose that is not a bullet\r\n"
    "\r\n"
    "## Links\r\n"
    "- https://example.com/design [2026-10-02]\r\n"
    "free text under an unknown section\r\n"
    "\r\n"
    "## Facts\r\n"
    "- 项目使用 jieba 分词 [2026-10-03]"
)


def test_hand_edited_file_survives_round_trip(store: MemoryStore) -> None:
    atomic_write(store.memory_path, HAND_EDITED)
    assert MemoryFile.parse(HAND_EDITED).render() == HAND_EDITED + "\r\n"

    entries = store.list()
    assert [e.text for e in entries] == [
        "Use aiohttp for the proxy",
        "an undated hand-written bullet",
        "项目使用 jieba 分词",
    ]
    assert entries[1].date is None

    assert store.store("Decisions", "Keep the live turn untouched", DAY).stored
    assert store.store("Gotchas", "Providers cache prompt prefixes", DAY).stored
    after = store.memory_path.read_bytes().decode("utf-8")
    assert after.endswith("\r\n") and "\n" not in after.replace("\r\n", "")
    for line in HAND_EDITED.split("\r\n"):
        assert line in after.split("\r\n"), line
    lines = after.split("\r\n")
    assert lines.index("- Keep the live turn untouched [2026-11-01]") == (
        lines.index("  continuation prose that is not a bullet") + 1
    )
    assert lines.index("## Gotchas") < lines.index("## Facts")
    assert "## Links" in lines and store.get(entry_id("Decisions", "Use aiohttp for the proxy"))


def test_person_edit_between_stores_is_kept(store: MemoryStore) -> None:
    store.store("Facts", "The proxy binds to loopback", DAY)
    edited = store.memory_path.read_text(encoding="utf-8") + "- typed by a person [2026-11-02]\n"
    store.memory_path.write_text(edited, encoding="utf-8")
    store.store("Facts", "Upstream errors pass through unchanged", DAY)
    texts = [e.text for e in store.list("Facts")]
    assert texts == [
        "The proxy binds to loopback",
        "typed by a person",
        "Upstream errors pass through unchanged",
    ]


def test_forget_preview_then_confirm(store: MemoryStore) -> None:
    keep = store.store("Facts", "Tokens are counted with cl100k_base", DAY).entry
    drop = store.store("Gotchas", "SSE keep-alive comments must pass through", DAY).entry
    zh = store.store("Facts", ZH, DAY).entry

    preview = store.forget([drop.id])
    assert not preview.removed and preview.matched == [drop]
    assert len(store.list()) == 3

    done = store.forget([drop.id], confirm=True)
    assert done.removed and done.matched == [drop]
    assert store.list() == [keep, zh]

    by_query = store.forget("sqlite", confirm=False)
    assert by_query.matched == [zh] and len(store.list()) == 2
    assert store.forget("sqlite", confirm=True).removed
    assert store.list() == [keep]

    nothing = store.forget(["deadbeef"], confirm=True)
    assert not nothing.removed and nothing.matched == []
    with pytest.raises(MemoryStoreError):
        store.forget([], confirm=True)


def _fill(store: MemoryStore) -> None:
    store.store("Decisions", "Use SQLite for durable originals", "2026-01-10")
    store.store("Constraints", "Never edit signed thinking blocks", "2026-06-01")
    store.store("Gotchas", "DeepSeek needs reasoning_content back in tool loops", "2026-10-20")
    store.store("Facts", ZH, DAY)


def test_export_import_json_round_trip(tmp_path: Path, store: MemoryStore) -> None:
    _fill(store)
    exported = store.export_json()
    payload = json.loads(exported)
    assert payload["version"] == 1 and len(payload["entries"]) == 4
    assert ZH in exported  # not \u-escaped

    other = MemoryStore(tmp_path / "other")
    result = other.import_(exported)
    assert (result.added, result.duplicates) == (4, 0)
    assert other.list() == store.list()

    again = other.import_(exported)
    assert (again.added, again.duplicates) == (0, 4)
    assert all("exact duplicate" in s.reason for s in again.skipped)


def test_export_import_markdown_round_trip(tmp_path: Path, store: MemoryStore) -> None:
    _fill(store)
    markdown = store.export_markdown()
    assert markdown.startswith("# Project Memory\n") and "## Gotchas\n" in markdown
    other = MemoryStore(tmp_path / "other")
    assert other.import_(markdown).added == 4
    assert other.list() == store.list()
    assert other.export_markdown() == markdown


def test_import_near_duplicates_need_force(tmp_path: Path, store: MemoryStore) -> None:
    store.store("Facts", BASE, DAY)
    data = json.dumps(
        [
            {"section": "Facts", "text": NEAR},
            {"section": "Notes", "text": "A brand new note", "date": "2026-11-03"},
        ]
    )
    plain = store.import_(data)
    assert (plain.added, plain.duplicates) == (1, 1)
    assert "near-duplicate" in plain.skipped[0].reason
    forced = store.import_(data, force=True)
    assert (forced.added, forced.duplicates) == (1, 1)  # the exact one is still skipped
    assert len(store.list()) == 3
    with pytest.raises(MemoryStoreError, match="unknown section"):
        store.import_(json.dumps([{"section": "Nope", "text": "x"}]))


def test_cleanup_dry_run_then_real(store: MemoryStore) -> None:
    _fill(store)
    preview = store.cleanup(older_than_days=90, today=DAY)
    assert [e.section for e in preview.matched] == ["Decisions", "Constraints"]
    assert not preview.removed and len(store.list()) == 4

    by_section = store.cleanup(older_than_days=90, section="Decisions", today=DAY)
    assert [e.section for e in by_section.matched] == ["Decisions"]

    done = store.cleanup(older_than_days=90, dry_run=False, today=DAY)
    assert done.removed and done.count == 2
    assert [e.section for e in store.list()] == ["Gotchas", "Facts"]

    zh_id = entry_id("Facts", ZH)
    assert store.cleanup(ids=[zh_id], dry_run=False).count == 1
    assert store.cleanup(section="Gotchas", dry_run=False).count == 1
    assert store.list() == []
    with pytest.raises(MemoryStoreError):
        store.cleanup()


def test_stats(store: MemoryStore) -> None:
    _fill(store)
    store.capture_note("ses_abcdef123456", "remember: prefer ripgrep", datetime(2026, 11, 1))
    stats = store.stats()
    assert stats["entries"] == 4 and stats["notes"] == 1
    assert stats["sections"]["Facts"] == 1 and stats["sections"]["Notes"] == 0
    assert (stats["oldest"], stats["newest"]) == ("2026-01-10", DAY)


def test_capture_note_dedup(store: MemoryStore) -> None:
    when = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)
    assert store.capture_note("ses_0123456789abcdef", "remember: 不要修改 signed blocks", when)
    assert not store.capture_note("ses_other", "Remember:  不要修改 signed blocks ", when)
    assert store.capture_note("ses_0123456789abcdef", "important: second note", when)
    notes = store.notes()
    headings = [line for line in notes.splitlines() if line.startswith("## ")]
    assert len(headings) == 2
    assert headings[0].startswith("## 2026-11-01T12:30:00+00:00 (session ses_0123) [")
    assert headings[0].endswith("]") and len(headings[0].rsplit("[", 1)[1]) == 9
    assert "remember: 不要修改 signed blocks\n" in notes
    assert store.stats()["notes"] == 2


def test_locked_update_reads_under_lock(tmp_path: Path) -> None:
    path = tmp_path / "f.md"
    locked_update(path, lambda old: old + "a\n")
    locked_update(path, lambda old: old + "b\n")
    assert path.read_text() == "a\nb\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


WRITER = """
import sys, time
from pathlib import Path
from memory.store import MemoryStore
store = MemoryStore(Path(sys.argv[1]), lock_dir=Path(sys.argv[4]))  # the shared data dir's
tag = sys.argv[2]
go = Path(sys.argv[3])
while not go.exists():  # start barrier: both writers begin together
    time.sleep(0.001)
for i in range(500):
    result = store.store("Facts", f"writer {tag} entry number {i} is unique", "2026-11-01")
    assert result.stored, result.reason
"""


@pytest.mark.slow
def test_two_processes_store_concurrently(tmp_path: Path) -> None:
    root = tmp_path / ".deep-memory"
    go = tmp_path / "go"
    locks = tmp_path / "data" / "locks"
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), tag, str(go), str(locks)], cwd=ROOT
        )
        for tag in ("alpha", "beta")
    ]
    time.sleep(0.5)
    go.touch()
    codes = [proc.wait(timeout=120) for proc in procs]
    elapsed = time.monotonic() - started
    assert codes == [0, 0]
    entries = MemoryStore(root).list()
    assert len(entries) == 1000
    assert len({e.id for e in entries}) == 1000
    writers = [e.text.split()[1] for e in entries]
    switches = sum(a != b for a, b in pairwise(writers))
    assert switches >= 2, "the two writers never interleaved"
    assert not list(root.glob("*.lock")) and list(locks.glob("*.lock"))  # locks out of the project
    assert elapsed < 60, elapsed
