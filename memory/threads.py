"""Threads that carry their name into the operating system.

Python names a thread for itself only: ``top -H``, ``/proc/<pid>/task/*/comm`` and
``benchmarks.concurrency`` see every thread of the proxy as ``python``, so which of them burns
the CPU (the rewrite workers, the embedding thread, or a native thread such as OpenBLAS's) can
only be guessed. ``NamedThread`` gives the kernel its name when it starts (Linux; the kernel
keeps 15 bytes of it, so the proxy's thread names fit in 15 bytes but for a worker's number).
``Background`` is one such thread for the writes nobody waits for.
"""

from __future__ import annotations

import ctypes
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
OS_NAME_BYTES = 15  # the kernel's limit, without the terminating NUL
_PR_SET_NAME = 15  # prctl(2): names the calling thread


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_SET_NAME = _prctl()


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (its first 15 bytes) in the operating system, where it
    can; elsewhere nothing."""
    if _SET_NAME is None:
        return
    data = name.encode("utf-8", "replace")[:OS_NAME_BYTES]
    _SET_NAME(_PR_SET_NAME, ctypes.c_char_p(data), 0, 0, 0)


class NamedThread(threading.Thread):
    """A ``threading.Thread`` whose name the operating system sees too."""

    def run(self) -> None:
        name_os_thread(self.name)
        super().run()


class Background:
    """One named thread that runs the jobs given to it, in order: work that must be done, and
    durably, but that no request need wait for (a compaction's checkpoint). A job is never
    dropped nor cancelled by this class; ``close`` waits for those given, at most
    ``timeout`` seconds. The thread starts with the first job."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: NamedThread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` after the jobs given before it; its result (or exception) in the
        future returned. ``RuntimeError`` once closed."""
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self.name} is closed")
            if self._thread is None:
                self._thread = NamedThread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._jobs.put((future, work))
        return future

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, work = job
            del job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled by whoever holds the future
            try:
                result = work()
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, work

    def drain(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, for the jobs given so far; whether they are
        done. Not from the thread's own jobs."""
        try:
            barrier = self.submit(lambda: None)
        except RuntimeError:  # closed: ``close`` waited for them
            return True
        try:
            barrier.result(timeout)
        except TimeoutError:
            return False
        return True

    def close(self, timeout: float) -> bool:
        """Take no more jobs; wait for those given, at most ``timeout`` seconds. Whether
        they are all done."""
        with self._lock:
            self._closed = True
            thread = self._thread
            if thread is None:
                return True
            self._jobs.put(None)
        thread.join(timeout)
        return not thread.is_alive()
