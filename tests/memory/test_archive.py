"""Checkpoint files on disk: names, contents, the per-session archive, pruning and the log."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from memory.archive import (
    CHECKPOINT_FILE,
    LOG_FILE,
    RAW_FILE,
    ArchiveError,
    archived_message,
    latest_checkpoint,
    session_checkpoints,
    session_dirname,
    write_checkpoint,
)

WHEN = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
MESSAGES = [
    {"role": "system", "content": "You are OpenCode."},
    {"role": "user", "content": "修复登录页面的错误"},
    {"role": "assistant", "content": "好的", "x-unknown": [1, 2.5, None]},
]


def test_writes_raw_history_checkpoint_archive_and_log(tmp_path):
    when = datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=UTC)
    written = write_checkpoint(tmp_path, "ses_abc", when, MESSAGES, "# Checkpoint — ses_abc\n")
    raw = orjson.loads((tmp_path / RAW_FILE).read_bytes())
    assert raw == {
        "capturedAt": "2026-11-21T10:00:00.123456+00:00",
        "sessionID": "ses_abc",
        "messageCount": 3,
        "messages": MESSAGES,
    }
    assert (tmp_path / CHECKPOINT_FILE).read_text() == "# Checkpoint — ses_abc\n"
    assert (
        written.archived_raw
        == tmp_path / "sessions/ses_abc/checkpoint-20261121T100000123456Z.raw.json"
    )
    assert written.archived_raw.read_bytes() == (tmp_path / RAW_FILE).read_bytes()
    [line] = (tmp_path / LOG_FILE).read_text().splitlines()
    logged = orjson.loads(line)
    assert logged["sessionID"] == "ses_abc" and logged["messageCount"] == 3
    assert logged["raw"] == "sessions/ses_abc/checkpoint-20261121T100000123456Z.raw.json"
    assert archived_message(tmp_path, "ses_abc", 1)["message"] == MESSAGES[1]


def test_keeps_the_last_n_per_session_and_finds_the_newest(tmp_path):
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(7):
        write_checkpoint(
            tmp_path, "ses_a", start + timedelta(hours=n), MESSAGES, f"# {n}\n", keep=3
        )
    write_checkpoint(tmp_path, "ses_b", start + timedelta(hours=3), MESSAGES, "# b\n", keep=3)
    archives = session_checkpoints(tmp_path, "ses_a")
    assert len(archives) == 3 and archives[0].checkpoint.read_text() == "# 6\n"
    assert len(list((tmp_path / "sessions/ses_a").iterdir())) == 6
    assert latest_checkpoint(tmp_path).session == "ses_a"
    assert len((tmp_path / LOG_FILE).read_text().splitlines()) == 8


def test_unsafe_session_ids_get_a_digest_directory(tmp_path):
    for hostile in ("../../etc", "a/b", "", ".hidden", "x" * 300):
        name = session_dirname(hostile)
        assert "/" not in name and not name.startswith(".") and len(name) <= 100
    when = datetime(2026, 1, 1, tzinfo=UTC)
    written = write_checkpoint(tmp_path, "../../escape", when, MESSAGES, "# x\n")
    assert written.archived_raw.resolve().is_relative_to(tmp_path.resolve())


def test_missing_archives_say_what_exists(tmp_path):
    with pytest.raises(ArchiveError, match="no archived history"):
        archived_message(tmp_path, "ses_none", 0)
    write_checkpoint(tmp_path, "ses_a", datetime(2026, 1, 1, tzinfo=UTC), MESSAGES, "# a\n")
    with pytest.raises(ArchiveError, match=r"3 archived messages \(0..2\)"):
        archived_message(tmp_path, "ses_a", 3)
    assert latest_checkpoint(tmp_path / "nowhere") is None


def _session_with_archive(memory_dir, sid: str, age_seconds: int, extra: str = "") -> None:
    directory = memory_dir / "sessions" / sid
    directory.mkdir(parents=True)
    for suffix in (".md", ".raw.json"):
        (directory / f"checkpoint-20261101T000000000000Z{suffix}").write_text("x")
    if extra:
        (directory / extra).write_text("kept")
    past = datetime.now(UTC).timestamp() - age_seconds
    os.utime(directory, (past, past))


def test_a_compaction_prunes_the_archives_of_all_but_the_newest_sessions(tmp_path):
    for n in range(6):  # ses_5 the most recently compacted
        extra = "notes-of-mine.txt" if n == 0 else ""
        _session_with_archive(tmp_path, f"ses_{n}", age_seconds=1000 - n * 100, extra=extra)
    written = write_checkpoint(tmp_path, "ses_now", WHEN, MESSAGES, "# c\n", keep_sessions=3)
    left = sorted(p.name for p in (tmp_path / "sessions").iterdir())
    assert left == ["ses_0", "ses_4", "ses_5", "ses_now"]  # ses_0 only for the user's own file
    assert list((tmp_path / "sessions" / "ses_0").iterdir()) == [
        tmp_path / "sessions" / "ses_0" / "notes-of-mine.txt"
    ]
    assert sorted({p.parent.name for p in written.removed}) == ["ses_0", "ses_1", "ses_2", "ses_3"]
    assert len(written.removed) == 8
    assert latest_checkpoint(tmp_path).session == "ses_now"


def test_the_raw_history_keeps_integers_beyond_64_bits(tmp_path):
    """A compaction request parsed exactly (it holds a huge integer) used to fail open with a
    traceback here: orjson refuses to write such an integer."""
    messages = [*MESSAGES, {"role": "user", "content": "go", "seed": -9223372036854775809}]
    written = write_checkpoint(
        tmp_path, "ses_big", WHEN, messages, "# c\n", log_fields={"n": 2**70}
    )
    assert '"seed": -9223372036854775809' in written.raw.read_text(encoding="utf-8")
    assert str(2**70) in (tmp_path / LOG_FILE).read_text(encoding="utf-8")
