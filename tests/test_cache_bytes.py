"""Every in-process cache is capped by bytes, not only by a count of sessions or items: many
sessions with large bodies must not grow the proxy's memory without bound."""

from __future__ import annotations

import orjson

from compressors.pipeline import Decision
from memory.ccr import OriginalStore
from memory.db import open_database
from memory.in_process import HISTORY_BYTES
from memory.injection_memo import Injected, InjectionMemo
from memory.memo import MemoStore
from proxy.compaction import CompactionStage
from proxy.costs import MAX_BYTES, PrefixTracker
from proxy.sessions import SessionRegistry

CAP = 10_000


def test_prefix_tracker_keeps_at_most_max_bytes_of_bodies():
    tracker = PrefixTracker(capacity=1000, max_bytes=CAP)
    for n in range(50):
        body = b"x" * 1500 + str(n).encode()
        tracker.observe((f"s{n}", "agent"), body, body, ttl=300.0, now=1.0)
        assert tracker.bytes <= CAP
    assert tracker.bytes == sum(p.size for p in tracker._previous.values())
    assert len(tracker) == CAP // 1502  # the same bytes sent as received count once
    tracker.observe(("huge", "agent"), b"y" * (CAP + 1), b"z", ttl=300.0, now=1.0)
    assert tracker.bytes <= CAP and len(tracker) >= 1  # too large to keep, the rest stays
    # A stream whose body was dropped is priced as cold, never against a wrong body.
    again = tracker.observe(("s0", "agent"), b"x" * 1500 + b"0", b"x", ttl=300.0, now=2.0)
    assert again.cached_in == 0


def test_live_memos_are_capped_by_their_text():
    memos = MemoStore(open_database(None), live_bytes=CAP)
    for n in range(40):
        memo = memos.load(f"s{n}")
        decision = Decision(level=1, text="compressed " * 100)
        memo.decisions[f"fp{n}"] = decision
        memos.save(f"s{n}", memo, {f"fp{n}": decision})
        assert memos.live_bytes <= CAP
    reloaded = memos.load("s0")  # evicted long ago: read back from the database
    assert reloaded.decisions["fp0"].text == "compressed " * 100


def test_live_injections_are_capped_by_their_text():
    injections = InjectionMemo(open_database(None), live_bytes=CAP)
    for n in range(40):
        injections.set_stable(f"s{n}", "stable " * 50)
        injections.add(f"s{n}", "anchor#0", Injected("recalled " * 100, 0))
        assert injections.live_bytes <= CAP
    assert injections.load("s0").by_anchor["anchor#0"].text == "recalled " * 100


def test_cached_originals_are_capped_by_size():
    store = OriginalStore(open_database(None), cache_bytes=CAP)
    originals = {f"{n:024x}": f"{n} " + "o" * 1000 for n in range(40)}
    store.put_many(originals)
    assert store.cache_bytes <= CAP
    store.put_many({"f" * 24: "big" * CAP})  # larger than the cache: kept in SQLite
    assert store.cache_bytes <= CAP
    assert store.get("ccr:" + "0" * 24) == originals["0" * 24].encode()
    assert store.get("f" * 24) == ("big" * CAP).encode()


async def test_many_sessions_with_large_bodies_stay_under_the_caps(proxy, client):
    """14 sessions x 6 MB: the prefix-pricing bodies and the compaction histories stay under
    their byte caps (they were capped by count: 64 streams and 256 MiB)."""
    body_size = 6 * 1024 * 1024
    for n in range(14):
        body = {
            "model": "m",
            "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
            "messages": [
                {"role": "system", "content": f"session {n}"},
                {"role": "user", "content": f"{n} " + "a" * body_size},
            ],
        }
        async with client.post(
            proxy.url + "/v1/chat/completions",
            data=orjson.dumps(body),
            headers={"x-session-id": f"ses_big_{n}"},
        ) as response:
            assert response.status == 200
            await response.read()
    state = proxy.state
    [compaction] = [t for t in state.addons if isinstance(t, CompactionStage)]
    assert 0 < state.sessions.prefixes.bytes <= MAX_BYTES
    assert 0 < compaction.histories.bytes <= HISTORY_BYTES
    assert state.stores.memos.live_bytes <= state.stores.memos._live.max_bytes
    assert state.stores.injections.live_bytes <= state.stores.injections._live.max_bytes


def test_session_statistics_keep_a_bounded_number_of_recent_requests():
    registry = SessionRegistry(capacity=1000, max_records=500)
    for n in range(100):
        session = registry.touch(f"s{n}", "default")
        for _ in range(20):
            registry.record_request(session, "agent", b"{}", b"{}", cache_ttl=300.0)
        assert registry.records <= 500
    kept = [registry.get(f"s{n}") for n in range(100)]
    assert registry.records == sum(len(s.recent) for s in kept if s is not None)
    assert kept[-1] is not None and len(kept[-1].recent) == 20  # the newest sessions stay
    assert kept[0] is None


def test_a_rewritten_body_holds_only_its_bytes():
    """orjson's bytes keep its growing buffer's capacity (10x the length for 400 KB): the
    forwarded body, which the prefix-cost tracker keeps, must not."""
    import tracemalloc

    from compressors import jsontext
    from proxy.pipeline import _exact_bytes

    body = {"messages": ["x" * 1000 for _ in range(300)], "ids": list(range(20_000))}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        out = _exact_bytes(jsontext.dumps(body))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(out) > 400_000 and held < 1.5 * len(out)
