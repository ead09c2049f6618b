"""Atomic writes, cross-process locks and path confinement for the memory files.

Every change goes through `locked_update`: take an exclusive `flock` on a lock file, re-read
the target, apply a pure edit function, and replace the file atomically. Because the text is
always re-read under the lock, a second proxy process never loses an entry; and because the
file is checked again just before the rename, a person saving the file in an editor between
our read and our write is not overwritten either (we redo the edit on top of their version).

Lock files live outside the project, in a lock directory (`<data_dir>/locks/` for the proxy
and the CLI), named by a hash of the file's real path: they never show in `git status`, and
two processes sharing the data dir still exclude each other.

A memory directory may be reached through symlinks, but its files must really lie inside the
directory that holds it (the project, or the data dir for the global memory): `memory_path`
resolves a path and refuses one that leaves it with `OutsideMemoryRoot`, so a symlinked
`.deep-memory` or `MEMORY.md` can neither make us write elsewhere nor read an outside file
into the prompt. Files are then opened with `O_NOFOLLOW`, so a symlink swapped in after the
check is refused too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DEFAULT_LOCK_TIMEOUT = 10.0
LOCKS_DIRNAME = "locks"
GITIGNORE = ".gitignore"
GITIGNORE_TEXT = """\
# Written by deepmem when it created this directory; it never overwrites this file.
# Worth committing: MEMORY.md (the project's decisions, constraints, gotchas) and notes.md
# (what people asked to remember). Not: the last compaction's checkpoint, raw transcripts,
# archived sessions and logs (large, per session, and they hold whole conversations).
checkpoint.md
*.raw.json
sessions/
.compaction-log.jsonl
*.tmp
*.lock
"""
_POLL_INTERVAL = 0.005
_MAX_EDIT_RETRIES = 5


class LockTimeout(TimeoutError):
    """The lock on a memory file could not be taken in time."""


class OutsideMemoryRoot(PermissionError):
    """A memory path whose real path leaves the directory it must stay in (a symlink out)."""


def confine(path: Path, boundary: Path) -> Path:
    """The real path of `path`; `OutsideMemoryRoot` unless it is `boundary` or inside it."""
    real = Path(os.path.realpath(path))
    limit = Path(os.path.realpath(boundary))
    if real != limit and not real.is_relative_to(limit):
        raise OutsideMemoryRoot(f"{path} leads outside {boundary} (a symlink?); refused")
    return real


def memory_path(memory_dir: Path, *parts: str) -> Path:
    """The real path of `memory_dir/parts`, which must stay in the directory holding
    `memory_dir` (the project for `.deep-memory`, the data dir for the global memory)."""
    return confine(memory_dir.joinpath(*parts), memory_dir.parent)


def make_memory_dirs(memory_dir: Path, *parts: str) -> Path:
    """Create `memory_dir/parts` one level at a time, each checked before the next is made
    (so a symlinked level never gets a directory created through it); its real path.

    A newly made memory directory gets a `.gitignore` for what should not be committed."""
    memory_dir.parent.mkdir(parents=True, exist_ok=True)
    real = memory_path(memory_dir)
    created = not real.exists()
    real.mkdir(exist_ok=True)
    if created:
        write_gitignore(real)
    for depth in range(1, len(parts) + 1):
        real = memory_path(memory_dir, *parts[:depth])
        real.mkdir(exist_ok=True)
    return real


def write_gitignore(directory: Path) -> bool:
    """Put deepmem's `.gitignore` in a memory directory unless it has one (never overwritten)."""
    try:
        fd = os.open(
            directory / GITIGNORE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644
        )
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(GITIGNORE_TEXT)
    return True


def default_lock_dir() -> Path:
    """Where locks go when no data dir is given (library use): a private per-user directory."""
    return Path(tempfile.gettempdir()) / f"deepmem-{os.getuid()}-{LOCKS_DIRNAME}"


def lock_path_for(path: Path, lock_dir: Path | None = None) -> Path:
    """The lock file of `path`: `<lock_dir>/<hash of its real path>.lock`."""
    real = os.path.realpath(path).encode("utf-8", "surrogateescape")
    directory = lock_dir if lock_dir is not None else default_lock_dir()
    return directory / f"{hashlib.sha256(real).hexdigest()[:32]}.lock"


def _lock_dir(directory: Path, shared_tmp: bool) -> None:
    """Create the lock directory (0700); refuse a symlink, and in the shared temp directory
    one that another user made."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or (shared_tmp and info.st_uid != os.getuid()):
        raise PermissionError(f"lock directory {directory} is not a directory of this user")


@contextlib.contextmanager
def file_lock(
    path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT, lock_dir: Path | None = None
) -> Iterator[None]:
    """Hold an exclusive advisory lock for `path` (on its lock file in the lock directory)."""
    lock_file = lock_path_for(path, lock_dir)
    _lock_dir(lock_file.parent, shared_tmp=lock_dir is None)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        _acquire(fd, lock_file, timeout)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _acquire(fd: int, lock_file: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(f"could not lock {lock_file} within {timeout:g} s") from None
            time.sleep(_POLL_INTERVAL)


def read_text(path: Path) -> str:
    """The file's text with line endings untouched; '' when it does not exist. A symlink as
    the last component is refused (ELOOP): pass a path `memory_path` resolved."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return ""
    with open(fd, encoding="utf-8", newline="") as handle:
        return handle.read()


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text`: temp file in the same directory, fsync, rename, fsync dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _existing_mode(path)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def _existing_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o777
    except FileNotFoundError:
        return 0o644


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def locked_update(
    path: Path,
    fn: Callable[[str], str],
    timeout: float = DEFAULT_LOCK_TIMEOUT,
    lock_dir: Path | None = None,
) -> str:
    """Apply `fn(old_text) -> new_text` to `path` under the lock; return the text written.

    `fn` must be pure: it may run more than once when the file changes under us (a person's
    editor does not take our lock). When `fn` returns the text unchanged nothing is written.
    """
    with file_lock(path, timeout, lock_dir):
        for _ in range(_MAX_EDIT_RETRIES):
            before = _signature(path)
            old = read_text(path)
            new = fn(old)
            if new == old:
                return old
            if _signature(path) == before:
                atomic_write(path, new)
                return new
        atomic_write(path, new)
        return new


def append_line(path: Path, line: str, lock_dir: Path | None = None) -> None:
    """Append one line under the file's lock, durably (never through a symlink)."""
    with file_lock(path, lock_dir=lock_dir):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
