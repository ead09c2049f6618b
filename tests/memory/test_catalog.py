"""What a project's memory recalls beside a user message."""

from __future__ import annotations

from memory.catalog import MemoryCatalog


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
