"""Bookkeeping off the request path (issue 16): a request's statistics, token counts, money
and dashboard record are counted after its answer has been relayed, in batches on a worker
thread; a reader never sees a request half counted nor one already answered left out."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy import sessions
from proxy.costs import StreamTokens
from proxy.prices import Prices
from proxy.sessions import Book, ChatFigures, SessionRegistry
from tests.conftest import RunningProxy
from tests.fake_upstream import FakeUpstream

SESSION = "ses_books"
STALL_SECONDS = 10  # a stalled step: far longer than any answer may take


def _body(turns: int, session_text: str = "Fix the parser.") -> bytes:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": session_text},
    ]
    for turn in range(turns):
        messages.append({"role": "assistant", "content": f"Step {turn}: reading the parser."})
        messages.append({"role": "user", "content": f"Continue with step {turn + 1}."})
    tools = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
    return orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": tools})


async def _chat(client: aiohttp.ClientSession, proxy: RunningProxy, body: bytes) -> int:
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=body,
        headers={"x-session-id": SESSION, "Content-Type": "application/json"},
        timeout=aiohttp.ClientTimeout(total=STALL_SECONDS / 2),
    ) as response:
        await response.read()
        return response.status


async def _stats(
    client: aiohttp.ClientSession, proxy: RunningProxy, **params: str
) -> dict[str, Any]:
    async with client.get(proxy.url + "/stats", params=params) as response:
        assert response.status == 200
        shown: dict[str, Any] = await response.json()
        return shown


async def _session(client: aiohttp.ClientSession, proxy: RunningProxy) -> dict[str, Any]:
    shown: dict[str, Any] = (await _stats(client, proxy, session=SESSION))["session"]
    return shown


def _hold_worker(registry: SessionRegistry, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The registry's worker never gets to count by itself (as when it is busy): whatever is
    counted was counted by a reader's flush. Returns a list that grows each time it would
    have been woken."""
    given: list[Any] = []
    monkeypatch.setattr(registry, "_schedule", lambda: given.append("wake"))
    return given


def _stall_pricing(
    registry: SessionRegistry, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Pricing a request (the prefix comparison) waits until the second event is set; the
    first is set once pricing has started."""
    release, pricing = threading.Event(), threading.Event()
    observe = registry.prefixes.observe

    def stalled(*args: Any, **kwargs: Any) -> StreamTokens:
        pricing.set()
        release.wait(STALL_SECONDS)
        return observe(*args, **kwargs)

    monkeypatch.setattr(registry.prefixes, "observe", stalled)
    return pricing, release


async def test_a_stalled_bookkeeping_step_does_not_delay_forwarding_or_the_answer(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pricing a request (the prefix comparison, tokens and money) waits until the answer is
    out: a pricing step that stalls holds neither the forwarding nor the answer; once it
    goes on, the figures are whole."""
    pricing, release = _stall_pricing(proxy.state.sessions, monkeypatch)
    try:
        assert await _chat(client, proxy, _body(1)) == 200
        assert len(upstream.requests) == 1  # forwarded and answered while pricing waits
        assert await asyncio.to_thread(pricing.wait, STALL_SECONDS)  # it did start, after
    finally:
        release.set()
    session = await _session(client, proxy)
    assert session["requests"] == 1
    assert session["request_tokens"]["tokens_before"] > 0
    assert session["money"]["original"] > 0  # gpt-4o has a price
    assert [row["status"] for row in session["recent_requests"]] == [200]


async def test_figures_are_whole_when_read_right_after_the_answer(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the worker not yet come round, a reader's flush counts every answered request:
    the core's counts, the tokens and cached prefix (against the session's previous request,
    in order), money, the record's status and its link to the rewrite record."""
    given = _hold_worker(proxy.state.sessions, monkeypatch)
    for turns in (1, 2, 3):
        assert await _chat(client, proxy, _body(turns)) == 200
    assert given  # the worker was to be woken, and has not run
    session = await _session(client, proxy)
    assert session["requests"] == 3 and session["kinds"] == {"agent": 3}
    assert session["usage_seen"]["responses"] == 3
    rows = session["recent_requests"]
    assert [row["status"] for row in rows] == [200, 200, 200]
    assert [row["tokens_before"] for row in rows] == sorted(row["tokens_before"] for row in rows)
    assert rows[0]["cached_before"] == 0 and all(row["cached_before"] > 0 for row in rows[1:])
    assert sum(row["tokens_before"] for row in rows) == session["request_tokens"]["tokens_before"]
    assert session["title"] == "Fix the parser."
    totals = (await _stats(client, proxy))["totals"]
    assert totals["requests"] == 3 and totals["request_tokens"] == session["request_tokens"]
    rewrite_id = rows[-1]["rewrite_id"]
    assert rewrite_id
    url = f"{proxy.url}/sessions/{SESSION}/requests/{rewrite_id}"
    async with client.get(url) as response:
        assert response.status == 200
        assert (await response.json())["request"]["session_id"] == SESSION


async def test_the_rewrite_view_flushes_before_it_reads(
    proxy: RunningProxy, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /sessions/{sid}/requests/{rid}`` counts what is answered before it looks."""
    given = _hold_worker(proxy.state.sessions, monkeypatch)
    assert await _chat(client, proxy, _body(1)) == 200
    assert given and len(proxy.state.rewrite_log) == 0  # not counted yet
    rewrite_id = f"{proxy.state.rewrite_log._prefix}-1"  # the first id this log hands out
    async with client.get(f"{proxy.url}/sessions/{SESSION}/requests/{rewrite_id}") as response:
        assert response.status == 200


async def test_a_reader_waiting_for_a_long_pricing_pass_does_not_stall_the_event_loop(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``/stats`` and the rewrite view count what is settled first; while the worker prices a
    long body they wait for it on a thread, and the proxy keeps answering meanwhile."""
    pricing, release = _stall_pricing(proxy.state.sessions, monkeypatch)
    try:
        assert await _chat(client, proxy, _body(1)) == 200
        assert await asyncio.to_thread(pricing.wait, STALL_SECONDS)  # the worker is pricing
        readers = [
            asyncio.ensure_future(_stats(client, proxy)),
            asyncio.ensure_future(client.get(f"{proxy.url}/sessions/{SESSION}/requests/x-1")),
        ]
        await asyncio.sleep(0.2)
        assert not any(reader.done() for reader in readers)  # both wait for the pricing
        async with client.get(
            proxy.url + "/health", timeout=aiohttp.ClientTimeout(total=2)
        ) as response:  # while the loop goes on serving
            assert response.status in (200, 503)
        assert await _chat(client, proxy, _body(2)) == 200
    finally:
        release.set()
    shown, view = await asyncio.gather(*readers)
    assert shown["totals"]["requests"] >= 1
    view.release()


async def test_a_failing_bookkeeping_step_is_logged_and_never_breaks_a_request(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(prices: Prices, model: str | None) -> None:
        raise RuntimeError("price table broke")

    monkeypatch.setattr(Prices, "lookup", broken)
    with caplog.at_level(logging.ERROR, logger="deepmem.proxy"):
        assert await _chat(client, proxy, _body(1)) == 200
        session = await _session(client, proxy)
    assert len(upstream.requests) == 1
    assert session["requests"] == 1  # the rest of its book is counted
    assert session["request_tokens"]["tokens_before"] > 0
    assert "price table broke" in caplog.text


def _chat_book(session_id: str, body: bytes, at: float) -> Book:
    return Book(at, session_id, "default", chat=ChatFigures("agent", body, body, 300.0))


def test_books_are_priced_in_the_order_entered_whatever_the_order_they_are_settled() -> None:
    """The prefix comparison prices a request against the one entered before it: the second
    request, answered first, waits for nothing, and both are counted in their order."""
    registry = SessionRegistry(10)
    first, second = b'{"a":"' + b"x" * 400 + b'"}', b'{"a":"' + b"x" * 400 + b'","b":1}'
    early, late = _chat_book("s", first, 1000.0), _chat_book("s", second, 1001.0)
    registry.enter(early)
    registry.enter(late)
    registry.settle(late)
    registry.shutdown()  # counts what is settled
    session = registry.get("s")
    assert session is not None and [record.at for record in session.recent] == [1001.0]
    assert session.recent[0].tokens.cached_in > 0  # priced against the first, still open
    registry.settle(early)
    registry.flush()
    assert [record.at for record in session.recent] == [1000.0, 1001.0]
    assert session.recent[0].tokens.cached_in == 0
    assert session.tally.request_tokens.tokens_in == sum(
        record.tokens.tokens_in for record in session.recent
    )


class _CountingLock:
    """A lock that counts how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def __enter__(self) -> None:
        self._lock.acquire()
        self.taken += 1

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_several_settled_books_are_counted_under_one_acquisition_of_the_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = SessionRegistry(10)
    given = _hold_worker(registry, monkeypatch)
    lock = _CountingLock()
    monkeypatch.setattr(registry, "_lock", lock)
    for n in range(5):
        book = _chat_book(f"s{n}", b'{"n":%d}' % n, 1000.0 + n)
        registry.enter(book)
        registry.settle(book)
    assert given and lock.taken == 0
    registry.flush()
    assert lock.taken == 1
    assert registry.totals.request_tokens.tokens_in > 0
    assert len(registry) == 5


def test_a_book_settled_before_it_is_entered_is_counted_once_entered() -> None:
    """A client that goes away while its request is being rewritten: the handler settles
    the book first, the rewrite thread enters it afterwards."""
    registry = SessionRegistry(10)
    book = _chat_book("s", b"{}", 1000.0)
    registry.settle(book)
    registry.flush()
    assert len(registry) == 0
    registry.enter(book)
    registry.flush()
    session = registry.get("s")
    assert session is not None and len(session.recent) == 1
    registry.shutdown()


async def test_a_request_whose_answer_takes_long_is_shown_meanwhile(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
) -> None:
    """The dashboard shows a request waiting for its answer as pending, as it did when it was
    counted before forwarding: counted meanwhile, its answer (status, usage) when relayed."""
    release = asyncio.Event()

    async def slow(request: web.Request, body: bytes) -> web.StreamResponse:
        await release.wait()
        return await upstream.provider_like(request, body)

    upstream.handler = slow
    answer = asyncio.create_task(_chat(client, proxy, _body(1)))
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            session = proxy.state.sessions.detail(SESSION)
            if session is not None and session["requests"] == 1:
                break
        assert session is not None and session["requests"] == 1
        assert [row["status"] for row in session["recent_requests"]] == [0]  # pending
        assert session["request_tokens"]["tokens_before"] > 0
        assert session["usage_seen"]["responses"] == 0
    finally:
        release.set()
    assert await answer == 200
    session = await _session(client, proxy)
    assert session["requests"] == 1  # counted once
    assert [row["status"] for row in session["recent_requests"]] == [200]
    assert session["usage_seen"]["responses"] == 1


async def test_a_requests_metrics_are_counted_once_it_has_been_forwarded(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
) -> None:
    """Issue 16: the metrics of a request (bytes in and out, the proxy's overhead) were
    counted on its way upstream; they wait for its answer now, as its statistics do."""
    metrics = proxy.state.metrics
    when_forwarded: list[float] = []

    async def provider(request: web.Request, body: bytes) -> web.StreamResponse:
        when_forwarded.append(metrics.counter_total("deepmem_bytes_in_total"))
        return await upstream.provider_like(request, body)

    upstream.handler = provider
    body = _body(1)
    assert await _chat(client, proxy, body) == 200
    assert when_forwarded == [0]
    for _ in range(200):  # counted as the handler ends, which the client need not wait for
        if metrics.counter_total("deepmem_bytes_in_total"):
            break
        await asyncio.sleep(0.01)
    assert metrics.counter_total("deepmem_bytes_in_total") == len(body)
    assert metrics.counter_total("deepmem_bytes_out_total") > 0
    overhead = metrics.histograms["deepmem_proxy_overhead_seconds"]
    assert sum(histogram.total for histogram in overhead.values()) == 1


def test_a_book_settled_in_parts_is_counted_once_and_each_part_in_turn() -> None:
    registry = SessionRegistry(10)
    book = _chat_book("s", b'{"a":1}', 1000.0)
    parts: list[str] = []
    registry.enter(book, commit=lambda b: parts.append("request"))
    registry.settle(book, lambda b: parts.append("meanwhile"), last=False)
    registry.flush()
    assert parts == ["request", "meanwhile"]
    registry.settle(book, lambda b: parts.append("answer"))
    registry.settle(book, lambda b: parts.append("after the last"))  # ignored
    registry.flush()
    assert parts == ["request", "meanwhile", "answer"]
    session = registry.get("s")
    assert session is not None and len(session.recent) == 1
    assert registry.totals.request_tokens.tokens_in == session.recent[0].tokens.tokens_in > 0
    registry.shutdown()


def test_the_worker_counts_settled_books_by_itself_and_stops_on_shutdown() -> None:
    registry = SessionRegistry(10)
    book = _chat_book("s", b'{"a":1}', 1000.0)
    registry.enter(book)
    registry.settle(book)
    worker = registry._worker
    assert worker is not None
    for _ in range(500):  # read without flushing: only the worker counts
        if registry.totals.request_tokens.tokens_in:
            break
        threading.Event().wait(0.01)
    assert registry.totals.request_tokens.tokens_in > 0
    registry.shutdown()
    worker.join(5)
    assert not worker.is_alive()
    late = _chat_book("s", b'{"a":2}', 1001.0)
    registry.enter(late)
    registry.settle(late)  # after shutdown: counted by the next reader
    assert len(registry.get("s").recent) == 2  # type: ignore[union-attr]


def test_a_request_still_being_answered_is_not_priced_for_another_ones_answer() -> None:
    """Counting one request's answer does no work for a request of another stream still
    being answered (it would compete with its relay)."""
    registry = SessionRegistry(10)
    answering, answered = _chat_book("a", b'{"a":1}', 1000.0), _chat_book("b", b'{"b":1}', 1001.0)
    untitled = _chat_book("a", b'{"t":1}', 1002.0)
    untitled.chat = ChatFigures("title", b'{"t":1}', b'{"t":1}', 300.0)
    for book in (answering, answered, untitled):
        registry.enter(book)
    registry.settle(answered)
    registry.settle(untitled)
    registry.flush()
    assert [answering.prepared, answered.prepared, untitled.prepared] == [False, True, True]
    assert answering.chat is not None and answering.chat.tokens is None
    registry.settle(answering)
    registry.flush()
    session = registry.get("a")
    assert answering.prepared and session is not None and len(session.recent) == 2
    registry.shutdown()


def _waited_for(condition: Callable[[], bool]) -> bool:
    for _ in range(500):
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_books_settled_while_the_worker_looks_do_not_wake_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first book of a busy spell wakes the bookkeeping thread; it then finds the next
    ones by itself (a request's answer wakes no thread as it goes out), and once a spell has
    been quiet for the linger time, the next book wakes it again."""
    monkeypatch.setattr(sessions, "BOOKS_LINGER_SECONDS", 0.3)
    registry = SessionRegistry(10)
    counted_by: list[str] = []

    def settle(number: int) -> None:
        book = _chat_book("s", b'{"a":%d}' % number, 1000.0 + number)
        registry.enter(book, commit=lambda b: counted_by.append(threading.current_thread().name))
        registry.settle(book)

    try:
        settle(1)
        assert _waited_for(lambda: registry.looking and len(counted_by) == 1)
        for number in (2, 3):
            settle(number)
            assert _waited_for(lambda n=number: len(counted_by) == n)
        assert registry.wakes == 1
        assert counted_by == ["deepmem-books"] * 3  # no reader counted them
        assert _waited_for(lambda: not registry.looking)  # quiet past the linger: it sleeps
        settle(4)
        assert _waited_for(lambda: len(counted_by) == 4)
        assert registry.wakes == 2
    finally:
        registry.shutdown()


def test_a_book_long_without_its_answer_is_shown_meanwhile_by_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 16: a timer was armed on the event loop and cancelled for every request, to show
    one whose answer takes long; the bookkeeping worker looks for those itself now, woken by
    the first, and goes on looking past the linger while one still waits."""
    monkeypatch.setattr(sessions, "BOOKS_LINGER_SECONDS", 0.2)
    registry = SessionRegistry(10)
    parts: list[str] = []
    quick, slow = _chat_book("s", b'{"a":1}', time.time()), _chat_book("t", b'{"a":2}', 0.0)
    try:
        registry.enter(quick, commit=lambda b: parts.append("quick"))
        registry.show_meanwhile(quick, lambda b: parts.append("quick meanwhile"))
        registry.settle(quick, lambda b: parts.append("quick answered"))  # before it was due
        assert _waited_for(lambda: "quick answered" in parts)
        slow.at = time.time() + 0.6  # arrives now, due in 0.7 s: past the linger
        registry.enter(slow, commit=lambda b: parts.append("slow"))
        registry.show_meanwhile(slow, lambda b: parts.append("slow meanwhile"))
        time.sleep(0.4)
        assert "slow" not in parts  # not due yet: nothing shown
        assert _waited_for(lambda: "slow meanwhile" in parts)
        assert registry.wakes == 1  # the first book woke it; it looked on while one waited
        registry.settle(slow, lambda b: parts.append("slow answered"))
        assert _waited_for(lambda: "slow answered" in parts)
        assert parts == [
            "quick",
            "quick answered",
            "slow",
            "slow meanwhile",
            "slow answered",
        ]
    finally:
        registry.shutdown()


def test_a_reader_sees_a_book_long_without_its_answer() -> None:
    """A reader counts first (the worker waits ``BOOKS_BATCH_SECONDS`` before it looks): it
    takes the long waits too, as the worker does."""
    registry = SessionRegistry(10)
    book = _chat_book("s", b'{"a":1}', time.time() - 1.0)
    shown: list[str] = []
    try:
        registry.enter(book, commit=lambda b: shown.append("request"))
        registry.show_meanwhile(book, lambda b: shown.append("meanwhile"))
        registry.flush()
        assert shown == ["request", "meanwhile"]
    finally:
        registry.shutdown()
