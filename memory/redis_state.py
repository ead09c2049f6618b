"""The request path's state on a Redis server several deepmem replicas share.

``RedisOriginals``, ``RedisDecisionMemos``, ``RedisInjectionMemos`` and ``RedisClock``
implement the protocols of ``memory/interfaces.py`` over one ``RedisState`` (the
connection). The protocols are synchronous and called from worker threads (and from the CLI,
where no event loop runs): ``RedisState`` runs redis-py's asyncio client on a private event-
loop thread of its own and waits for each result, so the proxy's event loop never waits on
Redis. Calling a store from a thread that runs an event loop is a programming error and
raises ``RuntimeError``.

Keys (the prefix, ``deepmem:`` by default, comes first; a session id is its UTF-8 bytes)::

    deepmem:ccr:<key>        string: an original's exact bytes (content-addressed, DESIGN.md 4)
    deepmem:memo:<session>   hash: level, thresholds_crossed, turn, events, version, and one
                             field ``d:<fingerprint>`` per compression decision
    deepmem:inj:<session>    hash: anchor (``system`` for the stable block) -> turn, tags, text
    deepmem:seen:<session>   string: the time of the session's latest chat request
    deepmem:history:<session>  hash: the session's last agent request (at, dialect, body)
    deepmem:project:<session>  string: the project the session's requests last named
    deepmem:active           sorted set: project -> when a session last named it

TTLs: an original lives ``retention_days`` after the last request that stored it (every
write refreshes it, at most once per ``cache_seconds`` per process: keys known to be stored
are not sent again); a session's memo and injections live ``retention_days`` after their last
save or added injection. Redis expires them itself, so ``purge_expired`` and ``prune`` find
nothing to do. Memory on the server is bounded by the originals (and sessions) written within
one retention period; in each process by ``live_bytes`` of memos and injections and
``cache_keys`` known original keys.

Round trips of a warm request: one to record it on the session's clock, one to load the
decision memo (a script answers "your copy is
current" by its version, or sends the whole memo), one to load the injections (the same by
the number of anchors), one to store new originals (none when every one is known), one to save
the decisions (a compare-and-set script on the version), one per new injection. A cold load
reads the whole hash: with the optional ``hiredis`` parser (``pip install deepmem[hiredis]``)
a 2,000-decision memo takes about 4 ms instead of 16. The first call of each script on a
server (or after its restart) costs two more round trips (NOSCRIPT, SCRIPT LOAD).

Run Redis with ``maxmemory-policy noeviction`` and with persistence (RDB or AOF): an evicted
or forgotten original breaks "nothing is lost" (its marker is upstream already). With
noeviction a full Redis refuses writes, which the stores raise as ``StateUnavailable`` and the
proxy turns into relaying requests unchanged. A server that restarted empty is noticed by the
memos (their version is gone); keys of originals this process knows as stored are sent again
only once its cache forgets them (``cache_seconds``).

Every failure of Redis (refused or lost connection, timeout, an error reply, a full server)
raises ``StateUnavailable`` naming what was being done, never the password. Timeouts are short
(one second to connect, one to answer; a call is waited for at most their sum, plus time to
move a large original) so a slow Redis fails open fast. After a server could not be
reached, calls fail at once for ``quiet_seconds`` (two) instead of each waiting for a
timeout; a probe (``ping``, ``check``: the proxy's health watch) or the first call after that
period connects again by itself, without a restart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar, cast

from cachetools import TTLCache
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from compressors.markers import normalize_key, utf8
from compressors.pipeline import Decision, SessionMemo
from compressors.view import Dialect
from memory.ccr import STORED_KEYS, StoredKeys
from memory.injection_memo import LIVE_BYTES as INJECTION_LIVE_BYTES
from memory.injection_memo import SYSTEM_ANCHOR, Injected, SessionInjections
from memory.live import LiveCopies
from memory.memo import LIVE_BYTES as MEMO_LIVE_BYTES
from memory.memo import memo_size
from memory.state import StateConflict, StateUnavailable
from memory.threads import NamedThread

T = TypeVar("T")
log = logging.getLogger("deepmem.state")

DEFAULT_PREFIX = "deepmem:"
QUIET_SECONDS = 2.0  # after Redis could not be reached, calls fail at once for this long
CACHE_KEYS = STORED_KEYS  # original keys known to be stored, per process
# A write of originals may take this much longer than one answer, per byte (a slow link still
# moves this much per second; each socket operation keeps its own short timeout).
SLOWEST_BYTES_PER_SECOND = 4 * 1024 * 1024
READ_ALLOWANCE_SECONDS = 10.0  # an expand may read an original of many megabytes
_USERINFO = re.compile(r"://[^/?#@\s\"'<>]+@")  # the user:password@ of a URL

# Loads a session's memo unless the caller's copy (ARGV[1]: its version) is current: 0 then,
# else the hash as a flat list. A session not stored (new or expired) is at version 0.
_LOAD_MEMO = """
local stored = redis.call('HGET', KEYS[1], 'version') or '0'
if stored == ARGV[1] then return 0 end
return redis.call('HGETALL', KEYS[1])
"""

# Saves a session's memo over the version it was read at (ARGV[1]), unless another writer
# saved since: {0, their version}. Else writes the fields (ARGV[3..], pairs) with the next
# version, refreshes the TTL (ARGV[2], seconds) and answers {1, the new version}. A session
# that is gone (expired) is written afresh at the next version, like SQLite's insert.
_SAVE_MEMO = """
local stored = redis.call('HGET', KEYS[1], 'version')
if stored and stored ~= ARGV[1] then return {0, stored} end
local version = tonumber(ARGV[1]) + 1
redis.call('HSET', KEYS[1], 'version', version)
for i = 3, #ARGV, 1000 do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return {1, version}
"""

# Loads a session's injections unless the caller's copy holds as many anchors (ARGV[1]) as
# the hash: 0 then, else the hash as a flat list. Anchors are never rewritten, only added.
_LOAD_INJECTIONS = """
if redis.call('HLEN', KEYS[1]) == tonumber(ARGV[1]) then return 0 end
return redis.call('HGETALL', KEYS[1])
"""

# Records an anchor's injection unless one is there (ARGV[1] anchor, ARGV[2] value) and
# refreshes the TTL (ARGV[3]): 1 when this one was written, else what the first writer wrote.
_ADD_INJECTION = """
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if added == 1 then return 1 end
return redis.call('HGET', KEYS[1], ARGV[1])
"""


def redact_url(text: str) -> str:
    """``text`` without the user:password of any URL in it."""
    return _USERINFO.sub("://<redacted>@", text)


def _reason(exc: BaseException) -> str:
    """What the server or the socket said; not the failed command of a pipeline, which
    redis-py quotes with its arguments (the original's text)."""
    why = str(exc).rpartition(" of pipeline caused error: ")[2] or type(exc).__name__
    return redact_url(why)


def _seconds(days: float) -> int:
    return max(1, math.ceil(days * 86400.0))


class RedisState:
    """One Redis server, reached from any thread: redis-py's asyncio client on a private
    event-loop thread. Share one between the stores; ``close`` it once."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = 1.0,
        socket_timeout: float = 1.0,
        quiet_seconds: float = QUIET_SECONDS,
    ) -> None:
        self.shown = redact_url(url)
        self.quiet_seconds = quiet_seconds
        self.prefix = utf8(prefix)
        # The longest a call may take: connecting and one answer (the client's own timeouts
        # fire first; this bounds a wait nothing else would).
        self.wait_seconds = connect_timeout + socket_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = NamedThread(target=self._loop.run_forever, name="deepmem-redis", daemon=True)
        self._thread.start()
        self._closed = False
        self._quiet_until = 0.0  # monotonic time until which calls fail without trying
        self._down_because = ""
        try:
            self.client: Redis = Redis.from_url(
                url,
                socket_connect_timeout=connect_timeout,
                socket_timeout=socket_timeout,
                # One retry, on a new connection: after a server restart every pooled one is
                # dead. Refused connections fail at once either way.
                retry=Retry(NoBackoff(), 1),
                decode_responses=False,
            )
        except (ValueError, RedisError) as exc:
            self.close()
            raise StateUnavailable(f"cannot use {self.shown}: {redact_url(str(exc))}") from exc

    def key(self, kind: bytes, name: bytes) -> bytes:
        return self.prefix + kind + b":" + name

    def run(
        self,
        doing: str,
        call: Callable[[Redis], Awaitable[T]],
        extra_seconds: float = 0.0,
        *,
        probe: bool = False,
    ) -> T:
        """``call(client)`` on the private loop, waited for at most ``wait_seconds`` (plus
        ``extra_seconds`` for a large transfer); ``StateUnavailable("<doing> …")`` when Redis
        fails. For ``quiet_seconds`` after Redis could not be reached, calls fail at once
        unless they ``probe``. Raises ``RuntimeError`` on a thread that runs an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                f"{doing}: the Redis state is synchronous; call it from a worker thread "
                "(asyncio.to_thread), not from an event loop"
            )
        if self._closed:
            raise StateUnavailable(f"{doing}: the connection to {self.shown} is closed")

        async def go() -> T:
            return await call(self.client)

        if not probe and time.monotonic() < self._quiet_until:
            # It did not answer a moment ago: fail at once rather than make every request of
            # every session wait for a timeout; the health check probes it meanwhile.
            raise StateUnavailable(f"{doing} on {self.shown}: {self._down_because}")
        future = asyncio.run_coroutine_threadsafe(go(), self._loop)
        wait = self.wait_seconds + extra_seconds
        try:
            result = future.result(wait)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            self._went_quiet(f"no answer in {wait:g} s")
            raise StateUnavailable(f"{doing} on {self.shown}: no answer in {wait:g} s") from exc
        except (RedisError, OSError, concurrent.futures.CancelledError) as exc:
            future.cancel()
            if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
                self._went_quiet(_reason(exc))
            raise StateUnavailable(f"{doing} on {self.shown}: {_reason(exc)}") from exc
        self._quiet_until = 0.0
        return result

    def submit(self, doing: str, call: Callable[[Redis], Awaitable[object]]) -> None:
        """``call(client)`` on the private loop without waiting for it: for a write nothing
        depends on at once. A failure is logged (and makes calls fail at once for a moment,
        like ``run``); nothing is sent while they do."""
        if self._closed or time.monotonic() < self._quiet_until:
            return

        async def go() -> object:
            return await call(self.client)

        def done(future: concurrent.futures.Future[object]) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is None:
                return
            if isinstance(exc, RedisConnectionError | RedisTimeoutError | OSError):
                self._went_quiet(_reason(exc))
            log.warning("%s on %s: %s", doing, self.shown, _reason(exc))

        asyncio.run_coroutine_threadsafe(go(), self._loop).add_done_callback(done)

    def _went_quiet(self, why: str) -> None:
        self._quiet_until = time.monotonic() + self.quiet_seconds
        self._down_because = f"unreachable a moment ago ({why}); trying again shortly"

    def ping(self) -> None:
        """Raises ``StateUnavailable`` unless the server answers (it is asked even while
        calls fail at once after a failure; an answer ends that)."""
        self.run("cannot reach the state server", lambda client: client.ping(), probe=True)

    def check(self) -> str | None:
        """What is wrong with the server for health: unreachable, or evicting keys (an evicted
        original is lost); None when it is fine."""
        try:
            info = self.run(
                "cannot reach the state server", lambda client: client.info("memory"), probe=True
            )
        except StateUnavailable as exc:
            return str(exc)
        policy = str(info.get("maxmemory_policy", "noeviction"))
        if policy != "noeviction":
            return (
                f"{self.shown} evicts keys when full (maxmemory-policy {policy}): an evicted "
                "original is lost; configure maxmemory-policy noeviction"
            )
        return None

    def close(self) -> None:
        """Close the connections and stop the loop thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        client: Redis | None = getattr(self, "client", None)
        if client is not None:
            future = asyncio.run_coroutine_threadsafe(client.aclose(), self._loop)
            try:
                future.result(self.wait_seconds)
            except (RedisError, OSError, concurrent.futures.CancelledError):
                future.cancel()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.wait_seconds)
        if not self._thread.is_alive():
            self._loop.close()


class RedisOriginals:
    """``Originals`` on Redis: one string per original, expiring ``retention_days`` after the
    last write that named it. Keys known to be stored (for ``cache_seconds``, never longer
    than half the retention) are not sent again. Safe to share between threads."""

    def __init__(
        self,
        state: RedisState,
        retention_days: float = 30.0,
        cache_keys: int = CACHE_KEYS,
        cache_seconds: float = 600.0,
    ) -> None:
        self.state = state
        self.read_error: str | None = None
        self.retention_seconds = retention_days * 86400.0
        self._ttl = _seconds(retention_days)
        ttl = min(cache_seconds, self.retention_seconds / 2)
        self._stored = StoredKeys(ttl, cache_keys)
        self._lock = threading.Lock()

    def _key(self, key: str) -> bytes:
        return self.state.key(b"ccr", key.encode("ascii"))

    def put_many(self, originals: Mapping[str, str]) -> int:
        """Store (or refresh the TTL of) every original not known to be stored, in one
        MULTI/EXEC: all or none. Raises ``StateUnavailable`` when Redis refuses or fails."""
        now = time.time()
        with self._lock:
            rows = [(key, utf8(text)) for key, text in self._stored.unknown(originals, now)]
        if not rows:
            return 0

        async def write(client: Redis) -> None:
            async with client.pipeline(transaction=True) as pipe:
                for key, content in rows:
                    pipe.set(self._key(key), content, ex=self._ttl, nx=True)
                    pipe.expire(self._key(key), self._ttl)
                await pipe.execute()

        size = sum(len(content) for _, content in rows)
        self.state.run(
            f"cannot store {len(rows)} originals", write, size / SLOWEST_BYTES_PER_SECOND
        )
        with self._lock:  # only once committed
            self._stored.add([key for key, _ in rows], now)
        return len(rows)

    def get(self, raw_key: str) -> bytes | None:
        """The original's exact bytes, or None when unknown or expired; raises
        ``StateUnavailable`` when Redis cannot be read."""
        key = normalize_key(raw_key)
        if key is None:
            return None
        try:
            found = self.state.run(
                f"cannot read original {key}",
                lambda client: client.get(self._key(key)),
                READ_ALLOWANCE_SECONDS,
            )
        except StateUnavailable as exc:
            self.read_error = str(exc)
            raise
        self.read_error = None
        return cast("bytes | None", found)  # the client decodes no responses

    def purge_expired(self) -> int:
        return 0  # Redis expires originals itself


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogatepass")


def _optional(text: str | None) -> bytes:
    """None as b"", a text (even an empty one) behind "="."""
    return b"" if text is None else b"=" + utf8(text)


def _from_optional(value: bytes) -> str | None:
    return _text(value[1:]) if value else None


def _encode_decision(decision: Decision) -> bytes:
    return b"%d %d " % (decision.level, int(decision.final)) + _optional(decision.text)


def _decode_decision(value: bytes) -> Decision:
    level, final, text = value.split(b" ", 2)
    return Decision(level=int(level), text=_from_optional(text), final=final == b"1")


def _pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


class RedisDecisionMemos:
    """``DecisionMemos`` on Redis: one hash per session, saved by compare-and-set on its
    version; an LRU of live memos (at most ``live_bytes``) that a load reuses while the stored
    version matches. Safe to share between threads (one session's requests must still come
    one at a time: its memo object is changed outside the lock)."""

    def __init__(
        self, state: RedisState, retention_days: float = 30.0, live_bytes: int = MEMO_LIVE_BYTES
    ) -> None:
        self.state = state
        self._ttl = _seconds(retention_days)
        self._live: LiveCopies[SessionMemo] = LiveCopies(live_bytes, memo_size)
        self._lock = threading.Lock()
        self._load = state.client.register_script(_LOAD_MEMO)
        self._save = state.client.register_script(_SAVE_MEMO)

    def _key(self, session_id: str) -> bytes:
        return self.state.key(b"memo", utf8(session_id))

    def load(self, session_id: str) -> SessionMemo:
        with self._lock:
            live = self._live.get(session_id)
        known = b"" if live is None else b"%d" % live.version
        found = self.state.run(
            f"cannot read the decisions of session {session_id}",
            lambda _: self._load(keys=[self._key(session_id)], args=[known]),
        )
        if found == 0 and live is not None:
            return live
        memo = SessionMemo()
        fields = _pairs(found)
        if fields:
            memo.level = int(fields[b"level"])
            memo.thresholds_crossed = int(fields[b"thresholds_crossed"])
            memo.turn = _from_optional(fields[b"turn"])
            memo.events = int(fields[b"events"])
            memo.version = int(fields[b"version"])
            for name, value in fields.items():
                if name.startswith(b"d:"):
                    memo.decisions[_text(name[2:])] = _decode_decision(value)
        self._keep(session_id, memo)
        return memo

    def save(self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]) -> None:
        """Persist the session's state and its changed decisions at once; ``StateConflict``
        (the live copy dropped) when another replica saved the session since ``memo`` was
        read, ``StateUnavailable`` (nothing saved) when Redis fails."""
        fields = [
            b"level", b"%d" % memo.level,
            b"thresholds_crossed", b"%d" % memo.thresholds_crossed,
            b"turn", _optional(memo.turn),
            b"events", b"%d" % memo.events,
        ]  # fmt: skip
        for fp, decision in changed.items():
            fields += [b"d:" + utf8(fp), _encode_decision(decision)]
        args = [b"%d" % memo.version, b"%d" % self._ttl, *fields]
        saved, version = self.state.run(
            f"cannot save the decisions of session {session_id}",
            lambda _: self._save(keys=[self._key(session_id)], args=args),
        )
        if not saved:
            self.forget_live(session_id)
            raise StateConflict(
                f"session {session_id}: its compression decisions were saved by another "
                f"process (version {int(version)}; this one read version {memo.version})"
            )
        memo.version = int(version)
        self._keep(session_id, memo)

    def save_later(
        self, session_id: str, memo: SessionMemo, changed: Mapping[str, Decision]
    ) -> None:
        """Saved at once: another replica may serve the session's next request."""
        self.save(session_id, memo, changed)

    def flush(self) -> None:
        """Nothing waits (``save_later`` saves at once)."""

    def forget_live(self, session_id: str) -> None:
        with self._lock:
            self._live.drop(session_id)

    def prune(self) -> int:
        return 0  # sessions expire by their TTL, the retention

    def _keep(self, session_id: str, memo: SessionMemo) -> None:
        """(Re-)insert a live memo, so the cache accounts for what it holds now."""
        with self._lock:
            self._live.keep(session_id, memo)

    @property
    def live_bytes(self) -> int:
        return self._live.bytes


def _encode_injected(injected: Injected) -> bytes:
    tags = utf8(",".join(injected.tags))
    return b"%d %d " % (injected.turn, len(tags)) + tags + utf8(injected.text)


def _decode_injected(value: bytes) -> Injected:
    turn, length, rest = value.split(b" ", 2)
    cut = int(length)
    tags = tuple(filter(None, _text(rest[:cut]).split(",")))
    return Injected(_text(rest[cut:]), int(turn), tags)


def _count(memo: SessionInjections) -> int:
    """How many anchors of the session's hash ``memo`` holds."""
    return len(memo.by_anchor) + (memo.stable is not None)


class RedisInjectionMemos:
    """``InjectionMemos`` on Redis: one hash per session, anchor -> injection, each written
    once (the first writer's stays, on every replica); an LRU of live copies (at most
    ``live_bytes``) that a load reuses while the hash holds as many anchors. Safe to share
    between threads."""

    def __init__(
        self,
        state: RedisState,
        retention_days: float = 30.0,
        live_bytes: int = INJECTION_LIVE_BYTES,
    ) -> None:
        self.state = state
        self._ttl = _seconds(retention_days)
        self._live: LiveCopies[SessionInjections] = LiveCopies(live_bytes, SessionInjections.size)
        self._lock = threading.Lock()
        self._load = state.client.register_script(_LOAD_INJECTIONS)
        self._add = state.client.register_script(_ADD_INJECTION)

    def _key(self, session_id: str) -> bytes:
        return self.state.key(b"inj", utf8(session_id))

    def load(self, session_id: str) -> SessionInjections:
        with self._lock:
            live = self._live.get(session_id)
        known = b"-1" if live is None else b"%d" % _count(live)
        found = self.state.run(
            f"cannot read the injections of session {session_id}",
            lambda _: self._load(keys=[self._key(session_id)], args=[known]),
        )
        if found == 0 and live is not None:
            return live
        memo = SessionInjections()
        for anchor, value in _pairs(found).items():
            injected = _decode_injected(value)
            if anchor == SYSTEM_ANCHOR.encode():
                memo.stable = injected.text
            else:
                memo.by_anchor[_text(anchor)] = injected
        self._keep(session_id, memo)
        return memo

    def set_stable(self, session_id: str, text: str) -> None:
        stored = self._insert(session_id, SYSTEM_ANCHOR, Injected(text, -1))
        with self._lock:
            live = self._live.get(session_id)
        if live is not None:
            live.stable = stored.text
            self._keep(session_id, live)

    def add(self, session_id: str, anchor: str, injected: Injected) -> None:
        stored = self._insert(session_id, anchor, injected)
        with self._lock:
            live = self._live.get(session_id)
        if live is not None:
            live.by_anchor[anchor] = stored
            self._keep(session_id, live)

    def _insert(self, session_id: str, anchor: str, injected: Injected) -> Injected:
        """Write the anchor's injection unless one exists, and return what the hash holds:
        a replica that decided first wins, here at once and on every later load."""
        found = self.state.run(
            f"cannot record an injection of session {session_id}",
            lambda _: self._add(
                keys=[self._key(session_id)],
                args=[utf8(anchor), _encode_injected(injected), b"%d" % self._ttl],
            ),
        )
        return injected if found == 1 else _decode_injected(found)

    def forget_live(self, session_id: str) -> None:
        with self._lock:
            self._live.drop(session_id)

    def prune(self, max_age_days: float) -> int:
        return 0  # sessions expire by their TTL, the retention

    def _keep(self, session_id: str, memo: SessionInjections) -> None:
        """(Re-)insert a live copy, so the cache accounts for what it holds now."""
        with self._lock:
            self._live.keep(session_id, memo)

    @property
    def live_bytes(self) -> int:
        return self._live.bytes


class RedisClock:
    """``RequestClock`` on Redis: one string per session holding the time of its latest chat
    request, swapped for the new time in one round trip (``SET … GET``), so every replica
    agrees on how long a session has been idle."""

    def __init__(self, state: RedisState, retention_days: float = 30.0) -> None:
        self.state = state
        self._ttl = _seconds(retention_days)

    def seen(self, session_id: str, now: float) -> float | None:
        key = self.state.key(b"seen", utf8(session_id))
        previous = self.state.run(
            f"cannot record a request of session {session_id}",
            lambda client: client.set(key, repr(now), ex=self._ttl, get=True),
        )
        return float(previous) if previous else None


HISTORY_SECONDS = 86_400  # a session's last agent request waits this long for a compaction
HISTORY_MAX_BYTES = 64 * 1024 * 1024

# Keeps a session's last agent request (ARGV: at, dialect, body, TTL) unless a newer one is
# there already: the writes are not waited for, so two may arrive out of order.
_REMEMBER = """
local at = redis.call('HGET', KEYS[1], 'at')
if at and tonumber(at) > tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'at', ARGV[1], 'dialect', ARGV[2], 'body', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
"""


class RedisHistories:
    """``Histories`` on Redis: each session's last agent request, written without waiting (a
    compaction comes seconds after the request it follows), read by the replica that gets the
    compaction. Costs Redis one body per session for a day, and the bandwidth of every agent
    request (sent once, not on the request's way upstream)."""

    def __init__(self, state: RedisState, ttl_seconds: int = HISTORY_SECONDS) -> None:
        self.state = state
        self._ttl = ttl_seconds
        self._remember = state.client.register_script(_REMEMBER)

    def _key(self, session_id: str) -> bytes:
        return self.state.key(b"history", utf8(session_id))

    def remember(self, session_id: str, dialect: Dialect, raw: bytes) -> None:
        if len(raw) > HISTORY_MAX_BYTES:
            return
        key, args = self._key(session_id), [repr(time.time()), dialect.value, raw, self._ttl]
        self.state.submit(
            f"cannot keep the last request of session {session_id}",
            lambda client: self._remember(keys=[key], args=args, client=client),
        )

    def get(self, session_id: str) -> tuple[Dialect, bytes] | None:
        key = self._key(session_id)
        dialect, body = cast(
            list[bytes | None],
            self.state.run(
                f"cannot read the last request of session {session_id}",
                lambda client: client.hmget(key, [b"dialect", b"body"]),
            ),
        )
        if dialect is None or body is None:
            return None
        try:
            return Dialect(dialect.decode()), body
        except ValueError:  # written by a version that knew another format
            return None


class RedisActivity:
    """``ProjectActivity`` on Redis: a session's project (one string each) and the projects
    named lately (one sorted set), written without waiting and at most once a minute per
    session and project from each replica."""

    NOTE_EVERY = 60.0  # seconds between two notes of the same session and project
    ACTIVE_KEEP = 86_400.0  # projects not named for this long leave the sorted set

    def __init__(self, state: RedisState, retention_days: float = 30.0) -> None:
        self.state = state
        self._ttl = _seconds(retention_days)
        self._noted: TTLCache[tuple[str, str], bool] = TTLCache(
            maxsize=100_000, ttl=self.NOTE_EVERY
        )
        self._lock = threading.Lock()

    def note(self, session_id: str, project: str, now: float) -> None:
        with self._lock:
            if (session_id, project) in self._noted:
                return
            self._noted[(session_id, project)] = True
        session_key = self.state.key(b"project", utf8(session_id))
        active_key = self.state.prefix + b"active"

        async def write(client: Redis) -> object:
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(session_key, utf8(project), ex=self._ttl)
                pipe.zadd(active_key, {utf8(project): now})
                pipe.zremrangebyscore(active_key, "-inf", now - self.ACTIVE_KEEP)
                return await pipe.execute()

        self.state.submit(f"cannot note the project of session {session_id}", write)

    def project_of(self, session_id: str) -> str | None:
        key = self.state.key(b"project", utf8(session_id))
        found = cast(
            bytes | None,
            self.state.run(
                f"cannot read the project of session {session_id}",
                lambda client: client.get(key),
            ),
        )
        return _text(found) if found is not None else None

    def active_since(self, since: float) -> list[str]:
        key = self.state.prefix + b"active"
        found = cast(
            list[bytes],
            self.state.run(
                "cannot read the active projects",
                lambda client: client.zrangebyscore(key, since, "+inf"),
            ),
        )
        return sorted(_text(path) for path in found)


# Every replica's snapshot (KEYS[1]: the set of names, ARGV[1]: the snapshots' key prefix) as
# a flat list of name, snapshot; a name whose snapshot expired leaves the set.
_SNAPSHOTS = """
local found = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local snapshot = redis.call('GET', ARGV[1] .. name)
  if snapshot then
    found[#found + 1] = name
    found[#found + 1] = snapshot
  else
    redis.call('SREM', KEYS[1], name)
  end
end
return found
"""


class RedisStatisticsBoard:
    """``StatisticsBoard`` on Redis: one string per replica (``deepmem:stats:<replica>``),
    expiring unless published again, and the set of names (``deepmem:replicas``) that a read
    walks in one script, dropping the names whose snapshot expired. One round trip to publish,
    one to read every snapshot. (The script reads keys it is not given: a single server, not
    a Redis Cluster.)"""

    def __init__(self, state: RedisState) -> None:
        self.state = state
        self._names = state.prefix + b"replicas"
        self._snapshot_prefix = state.key(b"stats", b"")
        self._snapshots = state.client.register_script(_SNAPSHOTS)

    def publish(self, replica: str, snapshot: bytes, ttl_seconds: int) -> None:
        name = utf8(replica)
        key = self._snapshot_prefix + name

        async def write(client: Redis) -> object:
            async with client.pipeline(transaction=True) as pipe:
                pipe.set(key, snapshot, ex=max(1, ttl_seconds))
                pipe.sadd(self._names, name)
                return await pipe.execute()

        self.state.run(
            f"cannot publish the statistics of replica {replica}",
            write,
            len(snapshot) / SLOWEST_BYTES_PER_SECOND,
        )

    def snapshots(self) -> dict[str, bytes]:
        found = cast(
            list[bytes],
            self.state.run(
                "cannot read the replicas' statistics",
                lambda client: self._snapshots(
                    keys=[self._names], args=[self._snapshot_prefix], client=client
                ),
                READ_ALLOWANCE_SECONDS,
            ),
        )
        return {_text(found[i]): found[i + 1] for i in range(0, len(found), 2)}
