"""Consolidation: lines that recur across sessions' checkpoints and notes become MEMORY.md
entries; a dry run writes nothing; duplicates and one-off lines are reported, not added."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from memory.checkpoint import Checkpoint
from memory.consolidate import consolidate, default_sources, read_lines
from memory.store import MemoryStore

WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
TODAY = "2026-03-05"


def _checkpoint(session: str, **sections: list[str]) -> str:
    return Checkpoint(session, WHEN, 10, intents=["work"], **sections).render()


def _memory_dir(tmp_path: Path) -> Path:
    root = tmp_path / ".deep-memory"
    first = _checkpoint(
        "ses_aaaaaaaa1",
        decisions=["Use uv for dependency management"],
        constraints=["Keep the public API backwards compatible"],
        gotchas=["ImportError: no module named foo → fixed by editing setup.cfg"],
    )
    second = _checkpoint(
        "ses_bbbbbbbb2",
        decisions=["use uv for dependency management."],
        constraints=["Never push directly to the main branch"],
        gotchas=["ImportError: no module named foo → fixed by editing setup.cfg"],
    )
    third = _checkpoint("ses_cccccccc3", decisions=["我们决定采用 Redis 作为缓存后端"])
    fourth = _checkpoint("ses_dddddddd4", decisions=["我们决定采用 Redis 作为缓存后端。"])
    (root / "sessions" / "ses_aaaaaaaa1").mkdir(parents=True)
    (root / "sessions" / "ses_bbbbbbbb2").mkdir(parents=True)
    (root / "sessions" / "ses_cccccccc3").mkdir(parents=True)
    (root / "sessions" / "ses_dddddddd4").mkdir(parents=True)
    (root / "checkpoint.md").write_text(second)
    # the latest checkpoint is archived in its session too: the same session counts once
    (root / "sessions" / "ses_bbbbbbbb2" / "checkpoint-1.md").write_text(second)
    (root / "sessions" / "ses_aaaaaaaa1" / "checkpoint-1.md").write_text(first)
    (root / "sessions" / "ses_aaaaaaaa1" / "checkpoint-2.md").write_text(first)
    (root / "sessions" / "ses_cccccccc3" / "checkpoint-1.md").write_text(third)
    (root / "sessions" / "ses_dddddddd4" / "checkpoint-1.md").write_text(fourth)
    (root / "notes.md").write_text(
        "## 2026-03-01T10:00:00+00:00 (session ses_eeee) [0a1b2c3d]\n\n"
        "Remember: never push directly to the main branch, ever!\n\n"
        "## 2026-03-02T10:00:00+00:00 (session ses_ffff) [1a1b2c3d]\n\n"
        "记住：周五不要部署到生产环境\n\n"
        "## 2026-03-03T10:00:00+00:00 (session ses_gggg) [2a1b2c3d]\n\n"
        "记住：周五不要部署到生产环境。\n"
    )
    return root


def _texts(result_items: list) -> list[tuple[str, str]]:
    return [(c.section, c.text) for c in result_items]


def test_sources_are_sessions(tmp_path: Path) -> None:
    root = _memory_dir(tmp_path)
    paths = default_sources(root)
    assert paths[0] == root / "checkpoint.md"
    assert paths[-1] == root / "notes.md"
    lines = [line for path in paths for line in read_lines(path)]
    assert {line.source for line in lines} == {
        "ses_aaaaaaaa1",
        "ses_bbbbbbbb2",
        "ses_cccccccc3",
        "ses_dddddddd4",
        "ses_eeee",
        "ses_ffff",
        "ses_gggg",
    }
    notes = read_lines(root / "notes.md")
    assert [(line.section, line.text) for line in notes] == [
        ("Constraints", "never push directly to the main branch, ever!"),
        ("Constraints", "周五不要部署到生产环境"),
        ("Constraints", "周五不要部署到生产环境。"),
    ]


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = _memory_dir(tmp_path)
    store = MemoryStore(root)
    result = consolidate(store, [root], dry_run=True, today=TODAY)
    assert result.dry_run
    assert not store.memory_path.exists()
    assert _texts(result.added) == [
        ("Decisions", "use uv for dependency management."),
        ("Constraints", "Never push directly to the main branch"),
        ("Gotchas", "ImportError: no module named foo → fixed by editing setup.cfg"),
        ("Decisions", "我们决定采用 Redis 作为缓存后端"),
        ("Constraints", "周五不要部署到生产环境"),
    ]
    never_push = result.added[1]
    assert never_push.sources == ("ses_bbbbbbbb2", "ses_eeee")
    assert never_push.variants == (
        "Never push directly to the main branch",
        "never push directly to the main branch, ever!",
    )
    skipped = {s.candidate.text: s.reason for s in result.skipped}
    # the same session twice (checkpoint.md and its archive, or two compactions) counts once
    assert skipped["Keep the public API backwards compatible"].startswith("seen in 1 source")
    assert len(skipped) == 1
    assert "would add 5" in result.report()


def test_real_run_folds_into_memory(tmp_path: Path) -> None:
    root = _memory_dir(tmp_path)
    store = MemoryStore(root)
    preview = consolidate(store, [root], today=TODAY)
    result = consolidate(store, [root], dry_run=False, today=TODAY)
    assert _texts(result.added) == _texts(preview.added)
    entries = [(e.section, e.text, e.date) for e in store.list()]
    assert entries == [
        ("Decisions", "use uv for dependency management.", TODAY),
        ("Decisions", "我们决定采用 Redis 作为缓存后端", TODAY),
        ("Constraints", "Never push directly to the main branch", TODAY),
        ("Constraints", "周五不要部署到生产环境", TODAY),
        ("Gotchas", "ImportError: no module named foo → fixed by editing setup.cfg", TODAY),
    ]
    again = consolidate(store, [root], dry_run=False, today=TODAY)
    assert again.added == []
    duplicates = [s for s in again.skipped if "duplicate" in s.reason]
    assert len(duplicates) == 5
    assert consolidate(store, [root], today=TODAY).added == []  # the preview agrees


def test_min_count(tmp_path: Path) -> None:
    root = _memory_dir(tmp_path)
    store = MemoryStore(root)
    assert consolidate(store, [root], min_count=3).added == []
    everything = consolidate(store, [root], min_count=1)
    assert len(everything.added) == 6
    assert ("Constraints", "Keep the public API backwards compatible") in _texts(everything.added)
    assert everything.skipped == []


def test_existing_entries_are_not_added_again(tmp_path: Path) -> None:
    root = _memory_dir(tmp_path)
    store = MemoryStore(root)
    store.store("Decisions", "Use uv for dependency management", today=TODAY)
    preview = consolidate(store, [root])
    (skip,) = [s for s in preview.skipped if s.candidate.section == "Decisions"]
    assert skip.reason.startswith("exact duplicate of")
    result = consolidate(store, [root], dry_run=False)
    assert [s.reason[:15] for s in result.skipped if s.candidate.section == "Decisions"] == [
        "exact duplicate"
    ]
    assert [e.text for e in store.list("Decisions")].count("Use uv for dependency management") == 1
    assert len(store.list("Decisions")) == 2


def test_files_as_sources_and_notes_default_section(tmp_path: Path) -> None:
    one = tmp_path / "a" / "checkpoint.md"
    two = tmp_path / "b" / "checkpoint.md"
    notes = tmp_path / "notes.md"
    one.parent.mkdir()
    two.parent.mkdir()
    one.write_text(_checkpoint("ses_1", gotchas=["Tests need TZ=UTC"]))
    two.write_text(_checkpoint("ses_2", gotchas=["tests need TZ=UTC"]))
    notes.write_text(
        "## 2026-03-01T10:00:00+00:00 (session s1) [0a1b2c3d]\n\nRemember the staging URL\n\n"
        "## 2026-03-01T11:00:00+00:00 (session s2) [1a1b2c3d]\n\nremember the staging url\n"
    )
    memory = tmp_path / "MEMORY.md"
    memory.write_text("# Project Memory\n")
    store = MemoryStore(tmp_path)
    result = consolidate(store, [one, two, notes, memory])
    assert _texts(result.added) == [
        ("Gotchas", "Tests need TZ=UTC"),
        ("Notes", "the staging URL"),
    ]


def test_a_note_counts_with_the_checkpoint_of_its_session(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.md").write_text(
        _checkpoint("ses_5f2a0001xyz", constraints=["Never run migrations on Fridays"])
    )
    notes = tmp_path / "notes.md"
    notes.write_text(
        "## 2026-03-01T10:00:00+00:00 (session ses_5f2a) [0a1b2c3d]\n\n"
        "Remember: never run migrations on Fridays\n"
    )
    store = MemoryStore(tmp_path)
    result = consolidate(store, [tmp_path])
    assert result.added == []
    assert result.skipped[0].candidate.sources == ("ses_5f2a0001xyz",)
    other = tmp_path / "sessions" / "ses_5f2a0002abc" / "checkpoint-1.md"
    other.parent.mkdir(parents=True)
    other.write_text(
        _checkpoint("ses_5f2a0002abc", constraints=["Never run migrations on Fridays"])
    )
    (added,) = consolidate(store, [tmp_path]).added
    assert added.sources == ("ses_5f2a0001xyz", "ses_5f2a0002abc")
