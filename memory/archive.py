"""Compaction checkpoints on disk, in a project's `.deep-memory/` (DESIGN.md section 5).

    checkpoint.md               the last compaction's extraction
    checkpoint.raw.json         {capturedAt, sessionID, messageCount, messages}: the history
    .compaction-log.jsonl       one line per compaction
    sessions/<sid>/             checkpoint-<stamp>.md and checkpoint-<stamp>.raw.json, the
                                last `keep` compactions of that session

Every file is written atomically (temp file, fsync, rename) under the same lock the memory
files use, so a second proxy process never interleaves with us. Every path is resolved with
`memory.files.memory_path` first: nothing is read or written through a symlink that leaves
the project (or the data dir, for the global memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from compressors import jsontext
from memory.files import (
    OutsideMemoryRoot,
    append_line,
    atomic_write,
    file_lock,
    make_memory_dirs,
    memory_path,
    read_text,
)

log = logging.getLogger("deepmem.memory")

CHECKPOINT_FILE = "checkpoint.md"
RAW_FILE = "checkpoint.raw.json"
LOG_FILE = ".compaction-log.jsonl"
SESSIONS_DIR = "sessions"
DEFAULT_KEEP = 5
# Sessions whose archives a project keeps: each compaction deletes the archives of the sessions
# beyond the newest KEEP_SESSIONS (by their last compaction), so `sessions/` stays bounded.
KEEP_SESSIONS = 30

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_ARCHIVED = re.compile(r"^checkpoint-(?P<stamp>\d{8}T\d{12}Z)\.md$")
_ARCHIVED_FILE = re.compile(r"^checkpoint-\d{8}T\d{12}Z\.(?:md|raw\.json)$")


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
    lock_dir: Path | None = None,
    keep_sessions: int = KEEP_SESSIONS,
) -> WrittenCheckpoint:
    """Write the raw history and the checkpoint, archive both, prune (the session's archives
    beyond ``keep``, the sessions beyond ``keep_sessions``), and log the compaction."""
    archived_checkpoint, archived_raw = archive_paths(memory_dir, session_id, captured_at)
    raw = jsontext.dumps(
        {
            "capturedAt": captured_at.astimezone(UTC).isoformat(),
            "sessionID": session_id,
            "messageCount": len(messages),
            "messages": messages,
        },
        indent=True,
    ).decode()
    written = WrittenCheckpoint(
        memory_dir / CHECKPOINT_FILE,
        memory_dir / RAW_FILE,
        archived_checkpoint,
        archived_raw,
    )
    session_dir = make_memory_dirs(memory_dir, SESSIONS_DIR, archived_checkpoint.parent.name)
    # Archive names are new for every compaction: a rename is all they need. The shared
    # files are replaced under their lock.
    atomic_write(session_dir / archived_raw.name, raw)
    atomic_write(session_dir / archived_checkpoint.name, checkpoint_markdown)
    for name, text in ((RAW_FILE, raw), (CHECKPOINT_FILE, checkpoint_markdown)):
        path = memory_path(memory_dir, name)
        with file_lock(path, lock_dir=lock_dir):
            atomic_write(path, text)
    pruned = _prune(session_dir, keep) + _prune_sessions(session_dir.parent, keep_sessions)
    removed = [memory_dir / SESSIONS_DIR / path.parent.name / path.name for path in pruned]
    line = {
        "capturedAt": captured_at.astimezone(UTC).isoformat(),
        "sessionID": session_id,
        "messageCount": len(messages),
        "checkpoint": str(written.archived_checkpoint.relative_to(memory_dir)),
        "raw": str(written.archived_raw.relative_to(memory_dir)),
        **(log_fields or {}),
    }
    append_line(memory_path(memory_dir, LOG_FILE), jsontext.dumps(line).decode(), lock_dir)
    return replace(written, removed=tuple(removed))


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


def _prune_sessions(sessions_dir: Path, keep: int) -> list[Path]:
    """Delete the archives of the sessions beyond the newest ``keep``; the files removed."""
    removed: list[Path] = []
    for session_dir in recent_session_dirs(sessions_dir)[max(keep, 1) :]:
        try:
            with os.scandir(session_dir) as entries:
                names = [e.name for e in entries if _ARCHIVED_FILE.match(e.name)]
        except FileNotFoundError:  # pruned meanwhile by another process
            continue
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (session_dir / name).unlink()
                removed.append(session_dir / name)
        with contextlib.suppress(OSError):  # left alone when it holds files of its own
            session_dir.rmdir()
    return removed


def recent_session_dirs(sessions_dir: Path, most: int | None = None) -> list[Path]:
    """The session directories (no symlinks), the most recently compacted first."""
    found: list[tuple[int, str, Path]] = []
    try:
        with os.scandir(sessions_dir) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):  # removed meanwhile by another process
                    if entry.is_dir(follow_symlinks=False):
                        mtime = entry.stat(follow_symlinks=False).st_mtime_ns
                        found.append((mtime, entry.name, Path(entry.path)))
    except OSError:
        return []
    found.sort(reverse=True)
    return [path for _, _, path in found[:most]]


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
    """A session's archived checkpoints, newest first (none when they cannot be read). Asked
    at every user turn of every session: most have none, which one ``stat`` tells, before
    the real path of the directory is checked (a dozen ``lstat`` calls)."""
    if not memory_dir.joinpath(SESSIONS_DIR, session_dirname(session_id)).is_dir():
        return []
    try:
        session_dir = memory_path(memory_dir, SESSIONS_DIR, session_dirname(session_id))
    except OutsideMemoryRoot as exc:
        log.warning("%s", exc)
        return []
    return [ArchivedCheckpoint(session_dir, s) for s in _archived_stamps(session_dir)]


def latest_checkpoint(memory_dir: Path, look_at: int = 3) -> ArchivedCheckpoint | None:
    """The newest archived checkpoint of the ``look_at`` most recently compacted sessions."""
    return max(newest_checkpoints(memory_dir, look_at), key=_stamp_of, default=None)


def newest_checkpoints(memory_dir: Path, most: int) -> list[ArchivedCheckpoint]:
    """The newest archived checkpoint of each of the ``most`` most recently compacted sessions
    that has one. The sessions directory's real path is checked once: the session directories
    listed in it are not symlinks, nor are the files taken from them."""
    try:
        sessions = memory_path(memory_dir, SESSIONS_DIR)
    except OutsideMemoryRoot as exc:
        log.warning("%s", exc)
        return []
    found = []
    for session_dir in recent_session_dirs(sessions, most):
        stamps = _archived_stamps(session_dir)
        if stamps:
            found.append(ArchivedCheckpoint(session_dir, stamps[0]))
    return found


def _stamp_of(checkpoint: ArchivedCheckpoint) -> str:
    return checkpoint.stamp


def _archived_stamps(session_dir: Path) -> list[str]:
    """The stamps of a session directory's archived checkpoints (no symlinks), newest first."""
    try:
        with os.scandir(session_dir) as entries:
            names = [e.name for e in entries if not e.is_symlink()]
    except OSError:
        return []
    return sorted((m.group("stamp") for n in names if (m := _ARCHIVED.match(n))), reverse=True)


class ArchiveError(LookupError):
    """An archived checkpoint or message that does not exist; the message says what is there."""


def archived_message(memory_dir: Path, session_id: str, index: int) -> dict[str, Any]:
    """Message ``index`` (0-based) of the session's newest archived history."""
    archives = session_checkpoints(memory_dir, session_id)
    if not archives:
        raise ArchiveError(f"no archived history for session {session_id!r} in {memory_dir}")
    data = orjson.loads(read_text(archives[0].raw))
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
