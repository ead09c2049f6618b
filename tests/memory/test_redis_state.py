"""The state protocols on a real Redis server shared by several "replicas" (store objects on
one server): what tests/memory/test_state_versions.py and test_injection.py pin for SQLite,
plus what only a network backend can do wrong (a server that stops, hangs or restarts empty,
a password, round trips)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compressors.markers import ccr_key
from compressors.pipeline import Decision
from memory.injection_memo import Injected
from memory.redis_state import (
    RedisActivity,
    RedisClock,
    RedisDecisionMemos,
    RedisHistories,
    RedisInjectionMemos,
    RedisOriginals,
    RedisState,
)
from memory.state import StateConflict, StateUnavailable
from tests.redis_server import RedisServer, redis_server_program

PASSWORD = "pw-Zq81x"  # never in an error message
RETENTION_DAYS = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One password-protected server for the module's contract tests."""
    running = RedisServer(redis_server_program(), tmp_path_factory.mktemp("redis"), PASSWORD)
    yield running.start()
    running.stop()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of its own, for a test that stops or pauses it."""
    running = RedisServer(redis_server_program(), tmp_path, PASSWORD)
    yield running.start()
    running.stop()


@pytest.fixture
def state(server: RedisServer) -> Iterator[RedisState]:
    connection = RedisState(server.url)
    yield connection
    connection.close()


_sessions = itertools.count()


def new_session() -> str:
    """A session id no other test used on the shared server."""
    return f"session-{os.getpid()}-{next(_sessions)}"


def commands(server: RedisServer) -> Counter[str]:
    """How many times the server ran each command so far (redis-cli's AUTH and INFO left
    out)."""
    counts: Counter[str] = Counter()
    for line in server.command("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_") and not line.startswith(("cmdstat_info", "cmdstat_auth")):
            name, _, stats = line[len("cmdstat_") :].partition(":")
            counts[name] = int(stats.split(",")[0].removeprefix("calls="))
    return counts


# --- originals -------------------------------------------------------------------------


def test_originals_come_back_byte_for_byte(state: RedisState, server: RedisServer) -> None:
    store = RedisOriginals(state, retention_days=RETENTION_DAYS)
    texts = [
        "plain ascii",
        "unicode: café 中文 \U0001f600",
        "a lone surrogate \udc80 survives",  # not valid UTF-8: stored as surrogatepass bytes
        "x" * 5_000_000 + "end",
    ]
    keyed = {ccr_key(text): text for text in texts}
    assert store.put_many(keyed) == len(texts)
    other = RedisOriginals(RedisState(server.url), retention_days=RETENTION_DAYS)
    for key, text in keyed.items():
        assert other.get(f"ccr:{key}") == text.encode("utf-8", "surrogatepass")
        assert other.get(f'"ccr:{key.upper()}"') == text.encode("utf-8", "surrogatepass")
    assert other.read_error is None
    assert other.get("ccr:" + "0" * 24) is None  # unknown
    assert other.get("not a key") is None
    assert store.purge_expired() == 0  # Redis expires originals itself
    other.state.close()


def test_an_original_lives_the_retention_and_a_later_write_refreshes_it(
    state: RedisState, server: RedisServer
) -> None:
    text = f"the original {new_session()}"
    key = ccr_key(text)
    first = RedisOriginals(state, retention_days=RETENTION_DAYS)
    first.put_many({key: text})
    name = f"deepmem:ccr:{key}"
    assert int(server.command("TTL", name)) == pytest.approx(RETENTION_DAYS * 86400, abs=5)
    assert first.put_many({key: text}) == 0  # known to be stored: not sent again
    server.command("EXPIRE", name, "60")
    second = RedisOriginals(state, retention_days=RETENTION_DAYS)  # another replica
    assert second.put_many({key: "other bytes under the same key"}) == 1
    assert int(server.command("TTL", name)) == pytest.approx(RETENTION_DAYS * 86400, abs=5)
    assert second.get(key) == text.encode()  # the first bytes stay (set if absent)
    assert second.retention_seconds == RETENTION_DAYS * 86400


def test_a_refused_write_keeps_none_and_is_sent_again(
    state: RedisState, server: RedisServer
) -> None:
    store = RedisOriginals(state)
    keyed = {ccr_key(t): t for t in (f"one {new_session()}", f"two {new_session()}")}
    server.command("CONFIG", "SET", "maxmemory", "1")  # full, noeviction: writes refused
    try:
        with pytest.raises(StateUnavailable, match="cannot store 2 originals") as raised:
            store.put_many(keyed)
    finally:
        server.command("CONFIG", "SET", "maxmemory", "0")
    assert "maxmemory" in str(raised.value) and "one " not in str(raised.value)
    assert all(store.get(key) is None for key in keyed)
    assert store.put_many(keyed) == 2  # not taken for stored after the failure
    assert all(store.get(key) == text.encode() for key, text in keyed.items())


# --- decision memos --------------------------------------------------------------------


def test_a_save_over_a_newer_version_is_refused_and_the_next_load_reads_it(
    state: RedisState,
) -> None:
    session = new_session()
    first, second = RedisDecisionMemos(state), RedisDecisionMemos(state)
    mine, theirs = first.load(session), second.load(session)
    first.save(session, mine, {"fp": Decision(1, "A's marker")})
    theirs.level = 2
    with pytest.raises(StateConflict, match="another process") as raised:
        second.save(session, theirs, {"fp": Decision(1, "B's marker")})
    assert isinstance(raised.value, StateUnavailable)
    again = second.load(session)
    assert again is not theirs and again.decisions["fp"].text == "A's marker"
    assert again.level == 1 and again.version == 1
    again.level = 2
    second.save(session, again, {})
    assert RedisDecisionMemos(state).load(session).version == 2
    # Unlike SQLite's live copy, a warm load sees the other replica's save at once.
    assert first.load(session).level == 2 and first.load(session).version == 2


def test_a_warm_load_reuses_the_live_memo_while_no_one_else_saved(state: RedisState) -> None:
    session = new_session()
    store = RedisDecisionMemos(state)
    memo = store.load(session)
    for n in range(5):
        store.save(session, memo, {f"fp{n}": Decision(1, str(n))})
    assert memo.version == 5
    assert store.load(session) is memo
    assert len(RedisDecisionMemos(state).load(session).decisions) == 5


def test_a_memo_round_trips_exactly(state: RedisState, server: RedisServer) -> None:
    session = new_session() + " with spaces and 中文"
    store = RedisDecisionMemos(state, retention_days=RETENTION_DAYS)
    memo = store.load(session)
    memo.level, memo.thresholds_crossed, memo.turn, memo.events = 3, 2, "", 7
    decisions = {
        "a" * 32: Decision(0),
        "b" * 32 + "#1": Decision(2, None, final=False),
        "call:" + "c" * 32: Decision(1, "", final=True),
        "d" * 32: Decision(1, "marker with a lone surrogate \ud800 and 1 2 spaces"),
    }
    many = {f"{n:032x}": Decision(1, f"text {n}") for n in range(3000)}  # > one Lua unpack
    store.save(session, memo, {**decisions, **many})
    loaded = RedisDecisionMemos(state).load(session)
    assert loaded.decisions == {**decisions, **many}
    assert (loaded.level, loaded.thresholds_crossed, loaded.turn, loaded.events) == (3, 2, "", 7)
    memo.turn = None
    store.save(session, memo, {})
    assert RedisDecisionMemos(state).load(session).turn is None
    ttl = int(server.command("TTL", f"deepmem:memo:{session}"))
    assert ttl == pytest.approx(RETENTION_DAYS * 86400, abs=5)
    assert store.prune() == 0


def test_warm_loads_and_saves_take_one_round_trip(state: RedisState, server: RedisServer) -> None:
    session = new_session()
    memos, injections = RedisDecisionMemos(state), RedisInjectionMemos(state)
    memo = memos.load(session)
    memos.save(session, memo, {"fp": Decision(1, "m")})
    injections.add(session, "anchor", Injected("hit", 0))
    injections.load(session)
    injections.load(session)  # the scripts are loaded on the server now

    def ran(action: object) -> Counter[str]:
        before = commands(server)
        assert callable(action)
        action()
        return commands(server) - before

    assert ran(lambda: memos.load(session)) == {"evalsha": 1, "hget": 1}
    changed = {"fp2": Decision(1, "n")}
    assert ran(lambda: memos.save(session, memo, changed)) == {
        "evalsha": 1, "hget": 1, "hset": 2, "expire": 1
    }  # fmt: skip
    assert ran(lambda: injections.load(session)) == {"evalsha": 1, "hlen": 1}
    assert ran(lambda: injections.add(session, "b", Injected("x", 1))) == {
        "evalsha": 1, "hsetnx": 1, "expire": 1
    }  # fmt: skip
    originals = RedisOriginals(state)
    new = {ccr_key(session): session}
    assert ran(lambda: originals.put_many(new)) == {"multi": 1, "set": 1, "expire": 1, "exec": 1}
    assert ran(lambda: originals.put_many(new)) == {}


# --- injections ------------------------------------------------------------------------


def test_the_first_injection_written_is_the_one_both_replicas_send(state: RedisState) -> None:
    session = new_session()
    first, second = RedisInjectionMemos(state), RedisInjectionMemos(state)
    second.load(session)  # B holds a live copy from before A wrote
    first.add(session, "anchor#0", Injected("A's recall", 0, ("memory", "resume:2026:01")))
    first.set_stable(session, "A's stable block")
    second.add(session, "anchor#0", Injected("B's recall", 0))
    second.set_stable(session, "B's stable block")
    for replica in (first, second, RedisInjectionMemos(state)):
        live = replica.load(session)
        assert live.by_anchor == {
            "anchor#0": Injected("A's recall", 0, ("memory", "resume:2026:01"))
        }
        assert live.stable == "A's stable block"
    assert first.prune(0) == 0


def test_a_live_copy_sees_another_replicas_new_anchor(
    state: RedisState, server: RedisServer
) -> None:
    session = new_session()
    first = RedisInjectionMemos(state, retention_days=RETENTION_DAYS)
    second = RedisInjectionMemos(state, retention_days=RETENTION_DAYS)
    first.add(session, "a", Injected("one \udc80", 0))
    live = first.load(session)
    assert first.load(session) is live  # unchanged: the live copy
    second.add(session, "b", Injected("two", 1, ("pressure",)))
    seen = first.load(session)
    assert seen.by_anchor == {
        "a": Injected("one \udc80", 0),
        "b": Injected("two", 1, ("pressure",)),
    }
    assert seen.stable is None
    ttl = int(server.command("TTL", f"deepmem:inj:{session}"))
    assert ttl == pytest.approx(RETENTION_DAYS * 86400, abs=5)


# --- failures --------------------------------------------------------------------------


def test_a_stopped_server_fails_fast_and_a_restarted_one_works_again(
    own_server: RedisServer,
) -> None:
    connection = RedisState(own_server.url)
    originals, memos = RedisOriginals(connection), RedisDecisionMemos(connection)
    injections = RedisInjectionMemos(connection)
    memo = memos.load("s")
    memos.save("s", memo, {"fp": Decision(1, "kept")})
    own_server.stop()
    for action in (
        lambda: originals.put_many({ccr_key("a"): "a"}),
        lambda: originals.get(ccr_key("a")),
        lambda: memos.load("s"),
        lambda: memos.save("s", memo, {}),
        lambda: injections.load("s"),
        lambda: injections.add("s", "x", Injected("x", 0)),
        connection.ping,
    ):
        started = time.monotonic()
        with pytest.raises(StateUnavailable) as raised:
            action()
        assert time.monotonic() - started < 2
        message = str(raised.value)
        assert "127.0.0.1" in message and "cannot" in message
        assert PASSWORD not in message
    assert originals.read_error is not None and PASSWORD not in originals.read_error
    assert connection.check() is not None
    own_server.start()  # the same port, empty (no persistence)
    connection.ping()
    assert connection.check() is None
    assert originals.put_many({ccr_key("a"): "a"}) == 1
    assert originals.get(ccr_key("a")) == b"a" and originals.read_error is None
    fresh = memos.load("s")  # the server forgot the session: so does the memo
    assert fresh.decisions == {} and fresh.version == 0
    memos.save("s", fresh, {"fp": Decision(1, "again")})
    injections.add("s", "x", Injected("x", 0))
    assert injections.load("s").by_anchor == {"x": Injected("x", 0)}
    connection.close()


def test_stores_opened_while_the_server_is_down_work_once_it_is_up(
    own_server: RedisServer,
) -> None:
    own_server.stop()
    connection = RedisState(own_server.url)  # connects on first use, not here
    memos, injections = RedisDecisionMemos(connection), RedisInjectionMemos(connection)
    with pytest.raises(StateUnavailable, match="cannot read the decisions of session s"):
        memos.load("s")
    own_server.start()
    connection.ping()  # the health check's probe: calls are tried again at once
    memos.save("s", memos.load("s"), {"fp": Decision(1, "up")})
    injections.set_stable("s", "stable")
    assert injections.load("s").stable == "stable"
    connection.close()


def test_a_server_that_does_not_answer_fails_within_the_timeouts(
    own_server: RedisServer,
) -> None:
    connection = RedisState(own_server.url, connect_timeout=0.5, socket_timeout=0.5)
    memos = RedisDecisionMemos(connection)
    memos.load("s")
    assert own_server.process is not None
    own_server.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StateUnavailable, match="cannot read the decisions of session s"):
            memos.load("s")
        assert time.monotonic() - started < 2
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    connection.ping()
    assert memos.load("s").version == 0
    connection.close()


def test_a_wait_longer_than_the_bound_is_given_up_and_the_next_call_works(
    own_server: RedisServer,
) -> None:
    connection = RedisState(own_server.url, connect_timeout=0.5, socket_timeout=30)
    connection.wait_seconds = 0.5  # shorter than the client's own timeout: ours fires
    memos = RedisDecisionMemos(connection)
    memos.load("s")
    assert own_server.process is not None
    own_server.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(StateUnavailable, match=r"no answer in 0\.5 s"):
            memos.load("s")
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    connection.ping()
    memo = memos.load("s")
    memos.save("s", memo, {"fp": Decision(1, "after")})
    assert RedisDecisionMemos(connection).load("s").decisions == {"fp": Decision(1, "after")}
    connection.close()


def test_after_a_failure_calls_fail_at_once_for_a_moment_then_try_again(
    own_server: RedisServer,
) -> None:
    connection = RedisState(own_server.url, quiet_seconds=0.5)
    memos = RedisDecisionMemos(connection)
    own_server.stop()
    with pytest.raises(StateUnavailable):
        memos.load("s")
    own_server.start()
    started = time.monotonic()
    with pytest.raises(StateUnavailable, match="unreachable a moment ago"):
        memos.load("s")  # not even tried: every request of every session is spared a timeout
    assert time.monotonic() - started < 0.05
    time.sleep(0.6)
    assert memos.load("s").version == 0  # tried again by itself
    connection.close()


def test_worker_threads_share_one_connection(state: RedisState) -> None:
    sessions = [new_session() for _ in range(8)]

    def work(session: str) -> int:
        memos, originals = RedisDecisionMemos(state), RedisOriginals(state)
        memo = memos.load(session)
        for n in range(20):
            originals.put_many({ccr_key(f"{session} {n}"): f"{session} {n}"})
            memos.save(session, memo, {f"fp{n}": Decision(1, f"{session} {n}")})
            memo = memos.load(session)
        return memo.version

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, sessions)) == [20] * 8
    for session in sessions:
        assert len(RedisDecisionMemos(state).load(session).decisions) == 20


def test_a_wrong_password_is_unavailable_and_never_shown(server: RedisServer) -> None:
    wrong = "pw-WRONG-42"
    connection = RedisState(server.url.replace(PASSWORD, wrong))
    with pytest.raises(StateUnavailable) as raised:
        RedisOriginals(connection).put_many({ccr_key("x"): "x"})
    assert wrong not in str(raised.value) and "<redacted>" in str(raised.value)
    connection.close()
    without = RedisState(server.url.replace(f":{PASSWORD}@", ""))
    with pytest.raises(StateUnavailable, match="authenticated"):
        without.ping()
    without.close()


def test_an_unusable_url_is_unavailable(server: RedisServer) -> None:
    with pytest.raises(StateUnavailable, match="cannot use") as raised:
        RedisState(f"http://user:{PASSWORD}@127.0.0.1:{server.port}")
    assert PASSWORD not in str(raised.value)


def test_the_check_reports_a_server_that_evicts(state: RedisState, server: RedisServer) -> None:
    assert state.check() is None
    server.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
    try:
        problem = state.check()
    finally:
        server.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    assert problem is not None and "allkeys-lru" in problem


async def test_calling_from_an_event_loop_is_refused(state: RedisState) -> None:
    with pytest.raises(RuntimeError, match="worker thread"):
        RedisDecisionMemos(state).load("s")
    # … and from a worker thread it works.
    assert (await asyncio.to_thread(RedisDecisionMemos(state).load, "s")).version >= 0


def test_a_closed_connection_is_unavailable(server: RedisServer) -> None:
    connection = RedisState(server.url)
    connection.close()
    connection.close()
    with pytest.raises(StateUnavailable, match="closed"):
        connection.ping()


# --- two replicas saving one session in any order --------------------------------------

_steps = st.lists(
    st.tuples(st.sampled_from(["load", "save"]), st.integers(0, 1)), min_size=1, max_size=30
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=_steps)
def test_no_committed_decision_is_ever_lost(
    state: RedisState, steps: list[tuple[str, int]]
) -> None:
    session = new_session()
    replicas = [RedisDecisionMemos(state), RedisDecisionMemos(state)]
    held = [replicas[0].load(session), replicas[1].load(session)]
    committed: set[str] = set()
    refused: set[str] = set()
    for n, (action, who) in enumerate(steps):
        if action == "load":
            held[who] = replicas[who].load(session)
            continue
        fp = f"fp{n}"
        memo = held[who]
        memo.decisions[fp] = Decision(1, f"by {who}")
        try:
            replicas[who].save(session, memo, {fp: memo.decisions[fp]})
        except StateConflict:
            refused.add(fp)
            held[who] = replicas[who].load(session)
        else:
            committed.add(fp)
    stored = RedisDecisionMemos(state).load(session)
    assert committed <= stored.decisions.keys()
    assert not refused & stored.decisions.keys()
    assert stored.version == len(committed)


def _eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + 2
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_clock_returns_the_previous_request_on_every_replica(state: RedisState) -> None:
    session = new_session()
    first, second = RedisClock(state), RedisClock(state)
    assert first.seen(session, 100.0) is None
    assert second.seen(session, 160.5) == 100.0
    assert first.seen(session, 170.0) == 160.5


def test_a_sessions_last_request_is_kept_for_the_replica_that_gets_its_compaction(
    state: RedisState,
) -> None:
    from compressors.view import Dialect

    session = new_session()
    writer, reader = RedisHistories(state), RedisHistories(state)
    assert reader.get(session) is None
    writer.remember(session, Dialect.ANTHROPIC, b'{"messages": [1]}')
    assert _eventually(lambda: reader.get(session) == (Dialect.ANTHROPIC, b'{"messages": [1]}'))
    writer.remember(session, Dialect.OPENAI_CHAT, b"\x00\xff newer")
    assert _eventually(lambda: reader.get(session) == (Dialect.OPENAI_CHAT, b"\x00\xff newer"))


def test_a_sessions_project_and_the_active_projects_are_shared(state: RedisState) -> None:
    session = new_session()
    a, b = RedisActivity(state), RedisActivity(state)
    now = time.time()
    a.note(session, "/work/app", now)
    assert _eventually(lambda: b.project_of(session) == "/work/app")
    assert "/work/app" in b.active_since(now - 1)
    assert "/work/app" not in b.active_since(now + 1)
    assert b.project_of(new_session()) is None
