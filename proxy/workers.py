"""The rewrite worker threads: a waiting request's rewrite before any work that can wait.

A request's rewrite delays its answer; deferred work (``proxy.flow.Flow.defer``, a cache
filled for the session's next request) delays nobody. With one first-in-first-out queue, a
burst of sessions queued their deferred work ahead of other sessions' requests; here a worker
takes deferred work only when no request's rewrite is waiting, and deferred work that has not
started can be cancelled (``Future.cancel``) when the request it was for arrives first.
"""

from __future__ import annotations

import enum
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class Priority(enum.IntEnum):
    """What a worker takes first: the lowest value waiting."""

    STOP = 0  # a worker's sign to end, ahead of anything still queued
    REQUEST = 1
    DEFERRED = 2


@dataclass(order=True, slots=True)
class _Job:
    priority: Priority
    order: int  # first come, first served within a priority
    future: Future[Any] | None = field(compare=False)
    work: Callable[[], Any] | None = field(compare=False)


class Workers:
    """A fixed number of threads, started on first use, that run the lowest-priority job
    waiting. ``submit`` returns a ``concurrent.futures.Future`` (``asyncio.wrap_future``
    awaits it); a job cancelled before a worker takes it never runs."""

    def __init__(self, count: int, name: str) -> None:
        self._count, self._name = count, name
        self._jobs: queue.PriorityQueue[_Job] = queue.PriorityQueue()
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, work: Callable[[], T], priority: Priority) -> Future[T]:
        if priority is Priority.STOP:
            raise ValueError("STOP is not a job's priority")
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the workers are closed")
            self._jobs.put(_Job(priority, next(self._order), future, work))
            if len(self._threads) < self._count:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            future, work = job.future, job.work
            del job
            if future is None or work is None:
                return
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                result = work()
            except BaseException as exc:  # the awaiting side sees it, as with an executor
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, work

    def close(self) -> None:
        """Cancel what waits and end the threads once their running jobs return (not
        waited for)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job.future is not None:
                    job.future.cancel()
            for _ in self._threads:
                self._jobs.put(_Job(Priority.STOP, next(self._order), None, None))
