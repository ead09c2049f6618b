"""Atomic writes and cross-process locks for the files under `.deep-memory/`.

Every change goes through `locked_update`: take an exclusive `flock` on a sidecar lock file,
re-read the target, apply a pure edit function, and replace the file atomically. Because the
text is always re-read under the lock, a second proxy process never loses an entry; and
because the file is checked again just before the rename, a person saving the file in an
editor between our read and our write is not overwritten either (we redo the edit on top of
their version).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

DEFAULT_LOCK_TIMEOUT = 10.0
_POLL_INTERVAL = 0.005
_MAX_EDIT_RETRIES = 5


class LockTimeout(TimeoutError):
    """The lock on a memory file could not be taken in time."""


def lock_path_for(path: Path) -> Path:
    """The sidecar lock file of `path`: `dir/.NAME.lock`."""
    return path.with_name(f".{path.name}.lock")


@contextlib.contextmanager
def file_lock(path: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Hold an exclusive advisory lock for `path` (on its sidecar lock file)."""
    lock_file = lock_path_for(path)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
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
    """The file's text with line endings untouched; '' when it does not exist."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


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
) -> str:
    """Apply `fn(old_text) -> new_text` to `path` under the lock; return the text written.

    `fn` must be pure: it may run more than once when the file changes under us (a person's
    editor does not take our lock). When `fn` returns the text unchanged nothing is written.
    """
    with file_lock(path, timeout):
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
