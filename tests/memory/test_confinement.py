"""Memory files stay in their project: symlinks out are refused, locks and junk stay out of git.

Real files and symlinks on disk: a `.deep-memory` (or one of its files) that is a symlink to a
directory outside the project must never be written or read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from memory.archive import (
    CHECKPOINT_FILE,
    LOG_FILE,
    RAW_FILE,
    latest_checkpoint,
    newest_checkpoints,
    session_checkpoints,
    write_checkpoint,
)
from memory.catalog import MemoryCatalog
from memory.consolidate import default_sources
from memory.files import (
    GITIGNORE,
    OutsideMemoryRoot,
    file_lock,
    lock_path_for,
    memory_path,
    read_text,
)
from memory.store import MemoryStore

OUTSIDE_MEMORY = "## Constraints\n\n- OUTSIDE-SECRET never leaves this file\n"
OUTSIDE_CHECKPOINT = "# Checkpoint — ses_x\n\n## Decisions\n\n- OUTSIDE-SECRET decision\n"
WHEN = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, MemoryCatalog]:
    """A project under an allowed root, an outside directory with memory files of its own."""
    project = tmp_path / "home" / "app"
    project.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "MEMORY.md").write_text(OUTSIDE_MEMORY)
    (outside / "notes.md").write_text("## old\n\nOUTSIDE-SECRET note\n")
    (outside / CHECKPOINT_FILE).write_text(OUTSIDE_CHECKPOINT)
    (outside / LOG_FILE).write_text("")
    (outside / "sessions" / "ses_x").mkdir(parents=True)
    stamp = "20261120T100000000000Z"
    (outside / "sessions" / "ses_x" / f"checkpoint-{stamp}.md").write_text(OUTSIDE_CHECKPOINT)
    return project, outside, MemoryCatalog(tmp_path / "data")


def assert_untouched_and_unread(outside: Path, before: dict[str, bytes], memory) -> None:
    assert snapshot(outside) == before
    assert memory.recall("OUTSIDE-SECRET decision never leaves", limit=5) == []
    assert not any("OUTSIDE-SECRET" in hit.document.text for hit in memory.search("OUTSIDE"))


def test_a_symlinked_memory_dir_is_neither_written_nor_read(layout) -> None:
    project, outside, catalog = layout
    (project / ".deep-memory").symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    memory = catalog.get(project)
    store = memory.store
    with pytest.raises(OutsideMemoryRoot):
        store.store("Facts", "a fact that must not land outside", "2026-11-01")
    with pytest.raises(OutsideMemoryRoot):
        store.capture_note("ses_a", "remember: not outside", WHEN)
    for read in (store.list, store.export_json, store.export_markdown, memory.stable_lines):
        with pytest.raises(OutsideMemoryRoot):
            read()
    with pytest.raises(OutsideMemoryRoot):
        write_checkpoint(project / ".deep-memory", "ses_a", WHEN, [], "# c\n", lock_dir=None)
    assert session_checkpoints(project / ".deep-memory", "ses_x") == []
    assert latest_checkpoint(project / ".deep-memory") is None
    assert_untouched_and_unread(outside, before, memory)


@pytest.mark.parametrize("name", ["MEMORY.md", "notes.md", CHECKPOINT_FILE, LOG_FILE, RAW_FILE])
def test_a_symlinked_memory_file_is_neither_written_nor_read(layout, name) -> None:
    project, outside, catalog = layout
    memory_dir = project / ".deep-memory"
    memory_dir.mkdir()
    target = outside / name
    target.touch()
    (memory_dir / name).symlink_to(target)
    before = snapshot(outside)
    memory = catalog.get(project)
    if name in ("MEMORY.md", "notes.md"):
        with pytest.raises(OutsideMemoryRoot):
            if name == "MEMORY.md":
                memory.store.store("Facts", "a fact that must not land outside", "2026-11-01")
            else:
                memory.store.capture_note("ses_a", "remember: not outside", WHEN)
    else:
        with pytest.raises(OutsideMemoryRoot):
            write_checkpoint(memory_dir, "ses_a", WHEN, [{"role": "user"}], "# Checkpoint\n")
    if name == "MEMORY.md":
        with pytest.raises(OutsideMemoryRoot):
            memory.stable_lines()
    assert_untouched_and_unread(outside, before, memory)


def test_a_symlinked_sessions_dir_gets_nothing_created_through_it(layout) -> None:
    project, outside, catalog = layout
    memory_dir = project / ".deep-memory"
    memory_dir.mkdir()
    (memory_dir / "sessions").symlink_to(outside / "sessions", target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(OutsideMemoryRoot):
        write_checkpoint(memory_dir, "ses_new", WHEN, [], "# Checkpoint\n")
    assert snapshot(outside) == before and not (outside / "sessions" / "ses_new").exists()
    assert session_checkpoints(memory_dir, "ses_x") == []
    assert newest_checkpoints(memory_dir, 20) == []
    assert_untouched_and_unread(outside, before, catalog.get(project))


def test_a_symlinked_session_dir_is_not_searched(layout) -> None:
    project, outside, catalog = layout
    sessions = project / ".deep-memory" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "ses_x").symlink_to(outside / "sessions" / "ses_x", target_is_directory=True)
    before = snapshot(outside)
    assert newest_checkpoints(project / ".deep-memory", 20) == []
    assert session_checkpoints(project / ".deep-memory", "ses_x") == []
    assert_untouched_and_unread(outside, before, catalog.get(project))


def test_a_symlink_that_stays_in_the_project_is_followed(layout) -> None:
    project, _, catalog = layout
    (project / "docs" / "memory").mkdir(parents=True)
    (project / ".deep-memory").symlink_to(project / "docs" / "memory", target_is_directory=True)
    memory = catalog.get(project)
    assert memory.store.store("Facts", "The staging port is 8443", "2026-11-01").stored
    assert "8443" in (project / "docs" / "memory" / "MEMORY.md").read_text()
    assert [line.text for line in memory.recall("which staging port", 5)] == [
        "The staging port is 8443"
    ]


def test_the_global_memory_stays_in_the_data_dir(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    (data / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutsideMemoryRoot):
        MemoryCatalog(data).get(None).store.capture_note("ses_a", "remember: x", WHEN)
    assert list(outside.iterdir()) == []


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tmp_path: Path) -> None:
    memory_dir = tmp_path / "app" / ".deep-memory"
    memory_dir.mkdir(parents=True)
    (tmp_path / "elsewhere.md").write_text("secret")
    checked = memory_path(memory_dir, "MEMORY.md")  # resolved while it did not exist
    checked.symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(OSError):
        read_text(checked)


def test_locks_live_in_the_data_dir_keyed_by_the_real_path(tmp_path: Path) -> None:
    project = tmp_path / "app"
    project.mkdir()
    catalog = MemoryCatalog(tmp_path / "data")
    memory = catalog.get(project)
    memory.store.store("Facts", "The staging port is 8443", "2026-11-01")
    memory.store.capture_note("ses_a", "remember: deploy with ansible", WHEN)
    write_checkpoint(memory.memory_dir, "ses_a", WHEN, [], "# c\n", lock_dir=catalog.lock_dir)
    assert not [p for p in project.rglob("*") if p.name.endswith(".lock")]
    assert len(list(catalog.lock_dir.glob("*.lock"))) >= 3
    alias = tmp_path / "alias"
    alias.symlink_to(project, target_is_directory=True)
    real = project / ".deep-memory" / "MEMORY.md"
    via_alias = alias / ".deep-memory" / "MEMORY.md"
    assert lock_path_for(via_alias, catalog.lock_dir) == lock_path_for(real, catalog.lock_dir)
    with (
        file_lock(real, lock_dir=catalog.lock_dir),
        pytest.raises(TimeoutError),
        file_lock(via_alias, timeout=0.05, lock_dir=catalog.lock_dir),
    ):
        pass


def test_a_new_memory_dir_gets_a_gitignore_that_is_never_overwritten(tmp_path: Path) -> None:
    project = tmp_path / "app"
    project.mkdir()
    store = MemoryStore(project / ".deep-memory")
    store.store("Facts", "The staging port is 8443", "2026-11-01")
    ignore = (project / ".deep-memory" / GITIGNORE).read_text()
    for pattern in ("*.raw.json", "sessions/", ".compaction-log.jsonl", "checkpoint.md"):
        assert pattern in ignore.splitlines()
    (project / ".deep-memory" / GITIGNORE).write_text("# mine\n")
    write_checkpoint(project / ".deep-memory", "ses_a", WHEN, [], "# c\n")
    assert (project / ".deep-memory" / GITIGNORE).read_text() == "# mine\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_status_shows_only_what_is_worth_committing(tmp_path: Path) -> None:
    project = tmp_path / "app"
    project.mkdir()
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
    subprocess.run(["git", "init", "-q", str(project)], check=True, env=env)
    catalog = MemoryCatalog(tmp_path / "data")
    memory = catalog.get(project)
    memory.store.store("Facts", "The staging port is 8443", "2026-11-01")
    memory.store.capture_note("ses_a", "remember: deploy with ansible", WHEN)
    for n in range(2):
        write_checkpoint(
            memory.memory_dir,
            f"ses_{n}",
            WHEN,
            [{"role": "user"}],
            "# c\n",
            lock_dir=catalog.lock_dir,
        )
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.splitlines()
    assert sorted(status) == [
        "?? .deep-memory/.gitignore",
        "?? .deep-memory/MEMORY.md",
        "?? .deep-memory/notes.md",
    ]


def test_consolidation_reads_no_checkpoint_outside_the_project(layout) -> None:
    project, outside, _ = layout
    memory_dir = project / ".deep-memory"
    memory_dir.mkdir()
    (memory_dir / "sessions").symlink_to(outside / "sessions", target_is_directory=True)
    (memory_dir / CHECKPOINT_FILE).symlink_to(outside / CHECKPOINT_FILE)
    assert default_sources(memory_dir) == []


def test_a_lock_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "locks").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(PermissionError), file_lock(tmp_path / "f.md", lock_dir=tmp_path / "locks"):
        pass
    assert list((tmp_path / "elsewhere").iterdir()) == []
