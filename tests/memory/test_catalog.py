"""What a project's memory recalls beside a user message."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from memory import catalog as catalog_module
from memory import search as search_module
from memory.archive import write_checkpoint
from memory.catalog import INDEXED_SESSIONS, MemoryCatalog

WHEN = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def test_recall_shows_a_line_once_though_two_files_hold_it(tmp_path):
    project = tmp_path / "app"
    (project / ".deep-memory" / "sessions" / "ses_a").mkdir(parents=True)
    checkpoint = "# Checkpoint — ses_a\n\n## Gotchas\n\n- The migration runner needs PGHOST set\n"
    (project / ".deep-memory" / "checkpoint.md").write_text(checkpoint)
    archived = (
        project / ".deep-memory" / "sessions" / "ses_a" / "checkpoint-20260101T000000000000Z.md"
    )
    archived.write_text(checkpoint)
    memory = MemoryCatalog(tmp_path / "data").get(project)
    lines = memory.recall("why does the migration runner fail", limit=5)
    assert [line.text for line in lines] == ["The migration runner needs PGHOST set"]


def _project_with_notes(tmp_path):
    project = tmp_path / "app"
    (project / ".deep-memory").mkdir(parents=True)
    (project / ".deep-memory" / "notes.md").write_text(
        "## 2026-11-20T10:00:00+00:00 (session ses_a) [0123abcd]\n\n"
        "Remember: deploys go through ansible, never scp.\n"
    )
    (project / ".deep-memory" / "MEMORY.md").write_text(
        "## Gotchas\n\n- The fixture loader breaks when PYTHONHASHSEED is set [2026-11-01]\n"
    )
    return MemoryCatalog(tmp_path / "data").get(project)


def test_a_message_of_stopwords_alone_recalls_nothing(tmp_path):
    memory = _project_with_notes(tmp_path)
    for text in ("Remember", "remember!", "Don't forget", "记住", "Please, can you do it?"):
        assert memory.recall(text, limit=5) == [], text
    assert [line.text for line in memory.recall("remember how we deploy with ansible?", 5)] == [
        "Remember: deploys go through ansible, never scp."
    ]


def test_one_shared_word_of_a_long_message_recalls_nothing(tmp_path):
    memory = _project_with_notes(tmp_path)
    long_message = "Rename the fixture constant, bump the changelog, rerun mypy, update docs"
    assert memory.recall(long_message, limit=5) == []
    found = memory.recall("the fixture loader fails randomly", limit=5)
    assert [line.text for line in found] == ["The fixture loader breaks when PYTHONHASHSEED is set"]


def test_search_indexes_the_newest_checkpoint_of_the_recent_sessions_only(tmp_path, monkeypatch):
    project = tmp_path / "app"
    sessions = project / ".deep-memory" / "sessions"
    total = INDEXED_SESSIONS + 5
    for n in range(total):
        directory = sessions / f"ses_{n:03d}"
        directory.mkdir(parents=True)
        for k, word in enumerate(("superseded", "current")):
            text = f"# Checkpoint — ses_{n:03d}\n\n## Decisions\n\n- {word} plan s{n:03d}\n"
            (directory / f"checkpoint-2026110{k}T000000000000Z.md").write_text(text)
        os.utime(directory, (1_000_000 + n, 1_000_000 + n))  # ses_024 compacted last
    memory = MemoryCatalog(tmp_path / "data").get(project)
    listings = []
    real = catalog_module.newest_checkpoints
    monkeypatch.setattr(
        catalog_module, "newest_checkpoints", lambda *a: listings.append(a) or real(*a)
    )
    found = {hit.document.path for hit in memory.search("current plan", limit=100)}
    archived = sorted(Path(p).parent.name for p in found if "sessions" in p)
    assert archived == [f"ses_{n:03d}" for n in range(total - INDEXED_SESSIONS, total)]
    assert not memory.search("superseded", limit=100)
    memory.search("plan", limit=5)
    memory.recall("what was the plan", limit=5)
    assert len(listings) == 1  # the archive is not listed again while it does not change
    write_checkpoint(project / ".deep-memory", "ses_new", WHEN, [], "## Decisions\n\n- zebra\n")
    hits = memory.search("zebra")
    assert len(listings) == 2  # a compaction changed it: listed once more
    # checkpoint.md and the archived copy hold the same line: it is listed once
    assert [hit.entry.text for hit in hits] == ["zebra"]
    assert "ses_new" in str(memory._archived)


def test_an_archived_checkpoint_is_read_once_then_not_looked_at_again(tmp_path, monkeypatch):
    """Issue 16: every search stat'ed each of the 20 archived checkpoints it indexes, files
    that are never written again (a new compaction archives a new one)."""
    project = tmp_path / "app"
    write_checkpoint(project / ".deep-memory", "ses_a", WHEN, [], "## Decisions\n\n- zebra\n")
    memory = MemoryCatalog(tmp_path / "data").get(project)
    assert [hit.entry.text for hit in memory.search("zebra")] == ["zebra"]
    looked_at: list[Path] = []
    stamp = search_module._stamp
    monkeypatch.setattr(search_module, "_stamp", lambda path: looked_at.append(path) or stamp(path))
    assert [hit.entry.text for hit in memory.search("zebra")] == ["zebra"]
    assert looked_at and not [path for path in looked_at if "sessions" in path.parts]


def test_a_session_without_an_archive_is_answered_without_resolving_real_paths(
    tmp_path, monkeypatch
):
    """Every user turn asks for its session's own checkpoints (the resume block), and most
    sessions have none: one stat says so, before the real path of the session's directory is
    checked (a dozen lstat calls each time)."""
    from memory import archive as archive_module
    from memory.archive import session_checkpoints

    memory_dir = tmp_path / "project" / ".deep-memory"
    write_checkpoint(memory_dir, "ses_done", datetime(2026, 11, 21, tzinfo=UTC), [], "# C\n")
    resolved: list[tuple[str, ...]] = []
    real_memory_path = archive_module.memory_path

    def memory_path(directory, *parts):
        resolved.append(parts)
        return real_memory_path(directory, *parts)

    monkeypatch.setattr(archive_module, "memory_path", memory_path)
    assert session_checkpoints(memory_dir, "ses_never") == [] and resolved == []
    [archived] = session_checkpoints(memory_dir, "ses_done")
    assert archived.session == "ses_done" and len(resolved) == 1


@given(
    st.lists(
        st.one_of(
            st.sampled_from([*catalog_module._STOPWORD_LIST, *"记住得别忘了不要记"]),
            st.text(alphabet="aAiIsSkKtTwWyY'ſİıK._- \n记别不住", max_size=8),
        ),
        max_size=30,
    ).map("".join)
)
def test_the_recall_query_loses_the_stopwords_the_plain_alternation_finds(text):
    """``_STOPWORDS`` looks ahead for the letters the words begin with before trying them:
    it removes exactly what the alternation alone removes, case-insensitively."""
    plain = re.compile(
        r"\b(?:{})\b|{}".format(
            "|".join(catalog_module._STOPWORD_LIST), "|".join(catalog_module._TASK_WORDS)
        ),
        re.IGNORECASE,
    )
    assert catalog_module._STOPWORDS.sub(" ", text) == plain.sub(" ", text)
