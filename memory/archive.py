"""Compaction checkpoints on disk, in a project's `.deep-memory/` (DESIGN.md section 5).

    checkpoint.md               the last compaction's extraction
    checkpoint.raw.json         {capturedAt, sessionID, messageCount, messages}: the history
    .compaction-log.jsonl       one line per compaction
    sessions/<sid>/             checkpoint-<stamp>.md and checkpoint-<stamp>.raw.json, the
                                last `keep` compactions of that session

Every file is written atomically (temp file, fsync, rename) under the same lock the memory
files use, so a second proxy process never interleaves with us.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from memory.files import atomic_write, file_lock

CHECKPOINT_FILE = "checkpoint.md"
RAW_FILE = "checkpoint.raw.json"
LOG_FILE = ".compaction-log.jsonl"
SESSIONS_DIR = "sessions"
DEFAULT_KEEP = 5

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ARCHIVED = re.compile(r"^checkpoint-(?P<stamp>\d{8}T\d{12}Z)\.md$")


def session_dirname(session_id: str) -> str:
    """The session's directory name: its id when that is a safe file name, else a digest."""
    if _SAFE_NAME.match(session_id) and ".." not in session_id:
        return session_id
    return "sid-" + hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def archive_paths(memory_dir: Path, session_id: str, captured_at: datetime) -> tuple[Path, Path]:
    """Where a compaction at ``captured_at`` archives its checkpoint and its raw history."""
    name = f"checkpoint-{stamp(captured_at)}"
    session_dir = memory_dir / SESSIONS_DIR / session_dirname(session_id)
    return session_dir / f"{name}.md", session_dir / f"{name}.raw.json"


@dataclass(frozen=True, slots=True)
class WrittenCheckpoint:
    checkpoint: Path
    raw: Path
    archived_checkpoint: Path
    archived_raw: Path
    removed: tuple[Path, ...] = ()  # archives beyond `keep` that were deleted


def write_checkpoint(
    memory_dir: Path,
    session_id: str,
    captured_at: datetime,
    messages: list[Any],
    checkpoint_markdown: str,
    keep: int = DEFAULT_KEEP,
    log_fields: dict[str, Any] | None = None,
) -> WrittenCheckpoint:
    """Write the raw history and the checkpoint, archive both, prune, and log the compaction."""
    archived_checkpoint, archived_raw = archive_paths(memory_dir, session_id, captured_at)
    session_dir = archived_checkpoint.parent
    raw = orjson.dumps(
        {
            "capturedAt": captured_at.astimezone(UTC).isoformat(),
            "sessionID": session_id,
            "messageCount": len(messages),
            "messages": messages,
        },
        option=orjson.OPT_INDENT_2,
    ).decode()
    written = WrittenCheckpoint(
        memory_dir / CHECKPOINT_FILE,
        memory_dir / RAW_FILE,
        archived_checkpoint,
        archived_raw,
    )
    session_dir.mkdir(parents=True, exist_ok=True)
    # Archive names are new for every compaction: a rename is all they need. The shared
    # files are replaced under their lock.
    atomic_write(written.archived_raw, raw)
    atomic_write(written.archived_checkpoint, checkpoint_markdown)
    for path, text in ((written.raw, raw), (written.checkpoint, checkpoint_markdown)):
        with file_lock(path):
            atomic_write(path, text)
    removed = _prune(session_dir, keep)
    line = {
        "capturedAt": captured_at.astimezone(UTC).isoformat(),
        "sessionID": session_id,
        "messageCount": len(messages),
        "checkpoint": str(written.archived_checkpoint.relative_to(memory_dir)),
        "raw": str(written.archived_raw.relative_to(memory_dir)),
        **(log_fields or {}),
    }
    append_line(memory_dir / LOG_FILE, orjson.dumps(line).decode())
    return replace(written, removed=tuple(removed))


def append_line(path: Path, line: str) -> None:
    """Append one line under the file's lock, durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


def _prune(session_dir: Path, keep: int) -> list[Path]:
    stamps = sorted(
        (m.group("stamp") for p in session_dir.iterdir() if (m := _ARCHIVED.match(p.name))),
        reverse=True,
    )
    removed = []
    for old in stamps[max(keep, 1) :]:
        for suffix in (".md", ".raw.json"):
            path = session_dir / f"checkpoint-{old}{suffix}"
            if path.exists():
                path.unlink()
                removed.append(path)
    return removed


@dataclass(frozen=True, slots=True)
class ArchivedCheckpoint:
    session_dir: Path
    stamp: str

    @property
    def checkpoint(self) -> Path:
        return self.session_dir / f"checkpoint-{self.stamp}.md"

    @property
    def raw(self) -> Path:
        return self.session_dir / f"checkpoint-{self.stamp}.raw.json"

    @property
    def session(self) -> str:
        return self.session_dir.name


def session_checkpoints(memory_dir: Path, session_id: str) -> list[ArchivedCheckpoint]:
    """A session's archived checkpoints, newest first."""
    session_dir = memory_dir / SESSIONS_DIR / session_dirname(session_id)
    try:
        names = [p.name for p in session_dir.iterdir()]
    except OSError:
        return []
    stamps = sorted((m.group("stamp") for n in names if (m := _ARCHIVED.match(n))), reverse=True)
    return [ArchivedCheckpoint(session_dir, s) for s in stamps]


def latest_checkpoint(memory_dir: Path) -> ArchivedCheckpoint | None:
    """The newest archived checkpoint of any session in this memory directory."""
    newest: ArchivedCheckpoint | None = None
    try:
        session_dirs = [p for p in (memory_dir / SESSIONS_DIR).iterdir() if p.is_dir()]
    except OSError:
        return None
    for session_dir in session_dirs:
        for name in os.listdir(session_dir):
            match = _ARCHIVED.match(name)
            if match and (newest is None or match.group("stamp") > newest.stamp):
                newest = ArchivedCheckpoint(session_dir, match.group("stamp"))
    return newest


class ArchiveError(LookupError):
    """An archived checkpoint or message that does not exist; the message says what is there."""


def archived_message(memory_dir: Path, session_id: str, index: int) -> dict[str, Any]:
    """Message ``index`` (0-based) of the session's newest archived history."""
    archives = session_checkpoints(memory_dir, session_id)
    if not archives:
        raise ArchiveError(f"no archived history for session {session_id!r} in {memory_dir}")
    data = orjson.loads(archives[0].raw.read_bytes())
    messages = data.get("messages") or []
    if not 0 <= index < len(messages):
        raise ArchiveError(
            f"session {session_id!r} has {len(messages)} archived messages (0..{len(messages) - 1})"
        )
    return {
        "sessionID": data.get("sessionID"),
        "capturedAt": data.get("capturedAt"),
        "index": index,
        "messageCount": len(messages),
        "message": messages[index],
    }
