"""The rewrite worker threads: a waiting request's rewrite before any work that can wait.

A request's rewrite delays its answer; deferred work (``proxy.flow.Flow.defer``, a cache
filled for the session's next request) delays nobody. With one first-in-first-out queue, a
burst of sessions queued their deferred work ahead of other sessions' requests; here a worker
takes deferred work only when no request's rewrite is waiting. Deferred work that has not
started can be cancelled (``Future.cancel``) when the request it was for arrives first, and at
most ``backlog`` jobs of it wait: under a load that leaves no worker free, the oldest are
dropped rather than kept (each holds a request's parsed outputs).
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from memory.threads import NamedThread

T = TypeVar("T")
DEFERRED_BACKLOG = 64  # deferred jobs waiting at most: one per active session, about


class Priority(enum.Enum):
    REQUEST = "request"  # taken first
    DEFERRED = "deferred"  # taken when no request waits


def _released() -> None:
    """What a job holds once a worker has taken it or it was cancelled: a deferred job's
    future (and with it the job, through its callback) may be kept after it is done
    (``RewriteRunner.run_after``), but not the request's outputs its work held."""


@dataclass(slots=True, eq=False)
class _Job:
    future: Future[Any]
    work: Callable[[], Any]


class Workers:
    """A fixed number of threads, started on first use, that run the waiting requests' jobs
    in order, then the deferred ones. ``submit`` returns a ``concurrent.futures.Future``
    (``asyncio.wrap_future`` awaits it); a job cancelled before a worker takes it never runs
    and is let go at once."""

    def __init__(self, count: int, name: str, backlog: int = DEFERRED_BACKLOG) -> None:
        self._count, self._name, self._backlog = count, name, backlog
        self._requests: deque[_Job] = deque()
        self._deferred: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._busy = 0  # threads running a job
        self._closed = False

    def submit(self, work: Callable[[], T], priority: Priority) -> Future[T]:
        future: Future[T] = Future()
        job = _Job(future, work)
        dropped: _Job | None = None
        with self._ready:
            if self._closed:
                raise RuntimeError("the workers are closed")
            if priority is Priority.REQUEST:
                self._requests.append(job)
            else:
                self._deferred.append(job)
                if len(self._deferred) > self._backlog:
                    dropped = self._deferred.popleft()
            if len(self._threads) < self._count:
                thread = NamedThread(
                    target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._ready.notify()
        if priority is Priority.DEFERRED:
            future.add_done_callback(lambda done: self._let_go(job, done))
        if dropped is not None:
            dropped.future.cancel()
        return future

    def _let_go(self, job: _Job, future: Future[Any]) -> None:
        """A deferred job cancelled while it waited leaves the queue at once."""
        if future.cancelled():
            job.work = _released
            with self._ready:
                if job in self._deferred:
                    self._deferred.remove(job)

    def _work(self) -> None:
        busy = False
        while True:
            with self._ready:
                if busy:
                    self._busy -= 1
                while not (self._requests or self._deferred or self._closed):
                    self._ready.wait()
                if self._closed:
                    return
                job = self._requests.popleft() if self._requests else self._deferred.popleft()
                self._busy += 1
                busy = True
            future, work = job.future, job.work
            job.work = _released  # the future's callback keeps the job, not what it runs
            del job
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                result = work()
            except BaseException as exc:  # the awaiting side sees it, as with an executor
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, work

    def starts_soon(self, future: Future[Any]) -> bool:
        """Whether the deferred job of ``future`` waits only for a free worker to take it:
        no more jobs are ahead of it than workers are free."""
        with self._ready:
            ahead = len(self._requests)
            free = len(self._threads) - self._busy
            for job in self._deferred:
                if job.future is future:
                    return ahead < free
                ahead += 1
        return False

    @property
    def deferred_waiting(self) -> int:
        return len(self._deferred)

    def close(self) -> None:
        """Cancel what waits and end the threads once their running jobs return (not
        waited for)."""
        with self._ready:
            self._closed = True
            waiting = [*self._requests, *self._deferred]
            self._requests.clear()
            self._deferred.clear()
            self._ready.notify_all()
        for job in waiting:
            job.future.cancel()
