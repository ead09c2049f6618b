"""The rewrite workers: a request's rewrite before deferred work; deferred work cancellable."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.pipeline import RewriteRunner
from proxy.workers import Priority, Workers


@pytest.fixture
def workers() -> Iterator[Workers]:
    pool = Workers(1, "test-worker")
    yield pool
    pool.close()


class Hold:
    """Work that keeps its worker busy until ``release`` is set."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.started.set()
        self.release.wait(10)


def blocked(pool: Workers) -> threading.Event:
    """The pool's one worker busy until the returned event is set."""
    hold = Hold()
    pool.submit(hold, Priority.REQUEST)
    assert hold.started.wait(10)
    return hold.release


def recorder(ran: list[str], name: str) -> Callable[[], str]:
    def work() -> str:
        ran.append(name)
        return name

    return work


def test_a_waiting_request_goes_before_deferred_work_queued_earlier(workers: Workers) -> None:
    release = blocked(workers)
    ran: list[str] = []
    later = [
        workers.submit(recorder(ran, "deferred 1"), Priority.DEFERRED),
        workers.submit(recorder(ran, "request 1"), Priority.REQUEST),
        workers.submit(recorder(ran, "deferred 2"), Priority.DEFERRED),
        workers.submit(recorder(ran, "request 2"), Priority.REQUEST),
    ]
    release.set()
    assert [future.result(10) for future in later] == [
        "deferred 1",
        "request 1",
        "deferred 2",
        "request 2",
    ]
    assert ran == ["request 1", "request 2", "deferred 1", "deferred 2"]


def test_a_job_cancelled_while_it_waits_never_runs(workers: Workers) -> None:
    release = blocked(workers)
    ran: list[str] = []
    cancelled = workers.submit(recorder(ran, "cancelled"), Priority.DEFERRED)
    kept = workers.submit(recorder(ran, "kept"), Priority.DEFERRED)
    assert cancelled.cancel()
    release.set()
    assert kept.result(10) == "kept"
    assert ran == ["kept"] and cancelled.cancelled()


def test_a_cancelled_job_leaves_the_queue_at_once(workers: Workers) -> None:
    release = blocked(workers)
    waiting = workers.submit(lambda: None, Priority.DEFERRED)
    assert workers.deferred_waiting == 1
    waiting.cancel()
    assert workers.deferred_waiting == 0  # what it holds is let go, not kept until its turn
    release.set()


def test_deferred_work_starts_soon_only_when_a_worker_is_free_for_it(workers: Workers) -> None:
    with workers._ready:  # no worker takes a job meanwhile (the lock is reentrant)
        first = workers.submit(lambda: None, Priority.DEFERRED)
        second = workers.submit(lambda: None, Priority.DEFERRED)
        assert workers.starts_soon(first)  # the one worker is free
        assert not workers.starts_soon(second)  # the free worker takes the first
    assert first.result(10) is None and second.result(10) is None
    release = blocked(workers)
    queued = workers.submit(lambda: None, Priority.DEFERRED)
    assert not workers.starts_soon(queued)  # the worker is busy
    release.set()
    assert queued.result(10) is None
    assert not workers.starts_soon(queued)  # done: not waiting


def test_deferred_work_waiting_is_bounded_the_oldest_dropped() -> None:
    pool = Workers(1, "test-worker", backlog=2)
    release = blocked(pool)
    ran: list[str] = []
    jobs = [pool.submit(recorder(ran, f"deferred {n}"), Priority.DEFERRED) for n in range(4)]
    assert pool.deferred_waiting == 2
    assert [job.cancelled() for job in jobs] == [True, True, False, False]
    release.set()
    assert [job.result(10) for job in jobs[2:]] == ["deferred 2", "deferred 3"]
    assert ran == ["deferred 2", "deferred 3"]
    pool.close()


def test_a_failure_reaches_the_future_and_the_worker_goes_on(workers: Workers) -> None:
    def broken() -> None:
        raise ValueError("a bug")

    failed = workers.submit(broken, Priority.REQUEST)
    with pytest.raises(ValueError, match="a bug"):
        failed.result(10)
    assert workers.submit(lambda: 7, Priority.REQUEST).result(10) == 7


def test_close_cancels_what_waits_and_refuses_new_work() -> None:
    pool = Workers(1, "test-worker")
    release = blocked(pool)
    waiting = pool.submit(lambda: None, Priority.REQUEST)
    pool.close()
    release.set()
    assert waiting.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(lambda: None, Priority.REQUEST)


async def test_a_sessions_next_request_cancels_its_deferred_work_not_yet_started() -> None:
    runner = RewriteRunner(workers=1)
    hold = Hold()
    release = hold.release
    try:
        other = asyncio.ensure_future(runner.run("other", hold))
        assert await asyncio.to_thread(hold.started.wait, 10)
        ran: list[str] = []
        runner.run_after("s", [lambda: ran.append("ahead for s")])
        runner.run_after("t", [lambda: ran.append("ahead for t")])
        nxt = asyncio.ensure_future(runner.run("s", lambda: ran.append("next of s")))
        await asyncio.sleep(0)  # the request of s has taken its turn
        release.set()
        await other
        await nxt
        for _ in range(500):
            if "ahead for t" in ran:
                break
            await asyncio.sleep(0.01)
        assert ran == ["next of s", "ahead for t"]  # s's own request did what was ahead
        assert runner.sessions_waiting == 0
    finally:
        release.set()
        runner.close()


async def test_deferred_work_does_not_hold_the_sessions_turn() -> None:
    runner = RewriteRunner(workers=2)
    slow_cache_fill = Hold()
    release = slow_cache_fill.release
    try:
        runner.run_after("s", [slow_cache_fill])
        assert await asyncio.to_thread(slow_cache_fill.started.wait, 10)
        # The session's next request runs beside it instead of waiting for it.
        assert await asyncio.wait_for(runner.run("s", lambda: "rewritten"), 5) == "rewritten"
    finally:
        release.set()
        runner.close()


async def test_deferred_work_offered_after_close_is_dropped_quietly() -> None:
    runner = RewriteRunner(workers=1)
    runner.close()
    runner.run_after("s", [lambda: None])  # a request answered while the proxy stops
    with pytest.raises(RuntimeError, match="closed"):
        await runner.run("s", lambda: None)


async def test_finished_deferred_work_calls_nothing_back_on_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 16: a request's deferred work finishing woke the event loop (a thread-safe call
    back, two callbacks on the loop) only to forget it; it is forgotten by the session's
    next request instead."""
    loop = asyncio.get_running_loop()
    woken: list[object] = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(*args: Any, **kwargs: Any) -> Any:
        woken.append(args[0])
        return call_soon_threadsafe(*args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    runner = RewriteRunner(workers=1)
    done = threading.Event()
    try:
        runner.run_after("s", [done.set])
        for _ in range(1000):  # polled: waiting on a thread would call back itself
            if done.is_set() and not runner.deferring("s"):
                break
            await asyncio.sleep(0.01)
        assert done.is_set()
        assert not runner.deferring("s")
        assert woken == []
        await runner.run("s", lambda: None)  # its next request forgets it
        assert not runner._deferred
    finally:
        runner.close()


async def test_sessions_with_finished_deferred_work_are_not_remembered_without_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("proxy.pipeline.DEFERRED_PRUNE_SESSIONS", 8)
    runner = RewriteRunner(workers=1)
    try:
        for n in range(100):
            finished = threading.Event()
            runner.run_after(f"s{n}", [finished.set])  # a session never heard of again
            assert await asyncio.to_thread(finished.wait, 10)
            for _ in range(100):  # the job is done once its future is
                if not runner.deferring(f"s{n}"):
                    break
                await asyncio.sleep(0.001)
        assert len(runner._deferred) <= 2 * 8 + 1
    finally:
        runner.close()


async def test_a_step_on_the_loop_runs_at_once_unless_its_sessions_turn_is_held() -> None:
    """Issue 16: a step rewritten on the event loop took the session's turn (a lock made,
    acquired, released) even when no request of the session held or awaited it."""
    runner = RewriteRunner(workers=1)
    hold = Hold()
    try:
        step = runner.run_here("s", lambda: runner.sessions_waiting)
        with pytest.raises(StopIteration) as finished:  # done without giving the loop up
            step.send(None)
        assert finished.value.value == 0  # no turn was taken: no lock made for it
        earlier = asyncio.ensure_future(runner.run("s", hold))
        assert await asyncio.to_thread(hold.started.wait, 10)
        ran: list[str] = []
        later = asyncio.ensure_future(runner.run_here("s", lambda: ran.append("on the loop")))
        await asyncio.sleep(0.05)
        assert ran == []  # waits for the session's earlier request
        hold.release.set()
        await earlier
        await later
        assert ran == ["on the loop"]
        assert runner.sessions_waiting == 0
    finally:
        hold.release.set()
        runner.close()


async def test_finished_deferred_work_leaves_the_next_request_nothing_to_wait_for() -> None:
    runner = RewriteRunner(workers=1)
    done = threading.Event()
    try:
        runner.run_after("s", [done.set])
        assert await asyncio.to_thread(done.wait, 10)
        for _ in range(1000):  # the job is done once its future is
            if not runner.deferring("s"):
                break
            await asyncio.sleep(0.001)
        assert runner.finish_started("s") is None
        assert not runner._deferred  # forgotten as it was looked at
        blocker = Hold()
        runner.run_after("s", [blocker])  # started, not finished: waited for
        assert await asyncio.to_thread(blocker.started.wait, 10)
        started = runner.finish_started("s")
        assert started is not None
        blocker.release.set()
        await started
        assert not runner.deferring("s")
    finally:
        runner.close()


class _Outputs:
    """Deferred work holding what a request parsed (its outputs), as a flow's jobs do."""

    def __init__(self) -> None:
        self.ran = threading.Event()

    def __call__(self) -> None:
        self.ran.set()


def test_a_kept_future_does_not_keep_what_its_job_held() -> None:
    """Regression (7f24317 keeps a session's finished deferred futures until its next request):
    the future's callback holds the job, so a job done or cancelled lets go of its work."""
    pool = Workers(1, "test")
    try:
        work = _Outputs()
        gone = weakref.ref(work)
        done = pool.submit(work, Priority.DEFERRED)
        assert work.ran.wait(10)
        done.result(10)
        del work
        for _ in range(500):  # the worker drops its own reference just after the result
            gc.collect()
            if gone() is None:
                break
            threading.Event().wait(0.01)
        assert gone() is None and done.done()

        hold = Hold()
        pool.submit(hold, Priority.REQUEST)
        assert hold.started.wait(10)
        waiting_work = _Outputs()
        gone = weakref.ref(waiting_work)
        waiting = pool.submit(waiting_work, Priority.DEFERRED)
        assert waiting.cancel()
        del waiting_work
        gc.collect()
        assert gone() is None and waiting.cancelled()
        hold.release.set()
    finally:
        pool.close()
