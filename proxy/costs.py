"""Estimated prompt-cache cost of each request, as the client sent it and as it was forwarded.

Providers cache prompt prefixes. For request t of a stream, ``cached`` is the longest common
byte prefix with request t-1 of the same stream, in estimated tokens (DESIGN.md section 7; the
byte-level estimate of ``compressors.tokens``, not tiktoken, because this runs on every
request). Costs are in units of one uncached input token:

- Anthropic-like: 0.1 per cached token, 1.25 per uncached one (the cache write);
- OpenAI-like: 0.5 per cached token, 1.0 per uncached one.

Both are linear, so a sum of requests is priced from the sums of its tokens and cached tokens:
``StreamTokens`` keeps only those four sums and prices them when asked.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from compressors.tokens import high_bytes, tokens_from_counts

MAX_STREAMS = 64  # previous bodies kept, to bound memory: the most recently seen streams
MAX_BYTES = 64 * 1024 * 1024  # and at most this many bytes of them


@dataclass(frozen=True, slots=True)
class CacheRates:
    cached: float
    uncached: float

    def cost(self, tokens: int, cached: int) -> float:
        return self.cached * cached + self.uncached * (tokens - cached)


ANTHROPIC = CacheRates(cached=0.1, uncached=1.25)
OPENAI = CacheRates(cached=0.5, uncached=1.0)
RATES: dict[str, CacheRates] = {"anthropic": ANTHROPIC, "openai": OPENAI}


def common_prefix_length(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at C speed.

    Binary search over memoryview slices: each probe compares only the bytes not yet known to
    match (``bytes.startswith`` at an offset: a memcmp, no copies), so the whole search reads
    O(n) bytes, not O(n log n).
    """
    low, high = 0, min(len(a), len(b))
    view = memoryview(a)
    if b.startswith(view[:high]):
        return high
    high -= 1  # a mismatch lies in a[:high + 1], so low <= answer <= high
    while low < high:
        middle = (low + high + 1) // 2
        if b.startswith(view[low:middle], low):
            low = middle
        else:
            high = middle - 1
    return low


@dataclass(slots=True)
class StreamTokens:
    """Estimated tokens of requests, and how many of them a prompt cache would have held."""

    tokens_in: int = 0  # as the client sent them
    cached_in: int = 0
    tokens_out: int = 0  # as they were forwarded
    cached_out: int = 0

    def add(self, other: StreamTokens) -> None:
        self.tokens_in += other.tokens_in
        self.cached_in += other.cached_in
        self.tokens_out += other.tokens_out
        self.cached_out += other.cached_out

    def costs(self) -> dict[str, dict[str, float]]:
        priced: dict[str, dict[str, float]] = {}
        for name, rates in RATES.items():
            original = rates.cost(self.tokens_in, self.cached_in)
            forwarded = rates.cost(self.tokens_out, self.cached_out)
            priced[name] = {
                "original": round(original, 2),
                "forwarded": round(forwarded, 2),
                "saved": round(original - forwarded, 2),
            }
        return priced

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens_before": self.tokens_in,
            "tokens_after": self.tokens_out,
            "cached_before": self.cached_in,
            "cached_after": self.cached_out,
            "cost": self.costs(),
        }


@dataclass(frozen=True, slots=True)
class _Body:
    """A body and its count of non-ASCII bytes (what the token estimate needs)."""

    data: bytes
    high: int

    @property
    def tokens(self) -> int:
        return tokens_from_counts(len(self.data), self.high)


@dataclass(slots=True)
class _Previous:
    original: _Body
    forwarded: _Body
    at: float

    @property
    def size(self) -> int:
        shared = self.forwarded.data is self.original.data
        return len(self.original.data) + (0 if shared else len(self.forwarded.data))


class PrefixTracker:
    """The previous original and forwarded body of each stream, while its cache may be warm.

    A stream is one kind of request in one session (a title request does not evict the agent's
    cache). Bodies older than ``ttl`` seconds are dropped (a cold cache holds nothing), and at
    most ``capacity`` streams and ``max_bytes`` of bodies are kept, the least recently seen
    dropped first (a stream whose bodies were dropped is priced as if its cache were cold).
    """

    def __init__(self, capacity: int = MAX_STREAMS, max_bytes: int = MAX_BYTES) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.bytes = 0  # of the bodies kept
        self._previous: OrderedDict[tuple[str, str], _Previous] = OrderedDict()

    def __len__(self) -> int:
        return len(self._previous)

    def observe(
        self,
        stream: tuple[str, str] | None,
        original: bytes,
        forwarded: bytes,
        ttl: float,
        now: float | None = None,
    ) -> StreamTokens:
        """Price one request against the stream's previous one and remember it."""
        now = time.time() if now is None else now
        self._expire(now, ttl)
        previous = self._pop(stream) if stream is not None else None
        figures = StreamTokens()
        if previous is None:
            before = _Body(original, high_bytes(original))
            after = before if forwarded is original else _Body(forwarded, high_bytes(forwarded))
        else:
            before, figures.cached_in = _against(previous.original, original)
            after, figures.cached_out = _against(previous.forwarded, forwarded)
        figures.tokens_in, figures.tokens_out = before.tokens, after.tokens
        if stream is not None:
            kept = _Previous(before, after, now)
            if kept.size <= self.max_bytes:
                self._previous[stream] = kept
                self.bytes += kept.size
            while len(self._previous) > self.capacity or self.bytes > self.max_bytes:
                self._drop_oldest()
        return figures

    def _pop(self, stream: tuple[str, str]) -> _Previous | None:
        previous = self._previous.pop(stream, None)
        if previous is not None:
            self.bytes -= previous.size
        return previous

    def _drop_oldest(self) -> None:
        _, oldest = self._previous.popitem(last=False)
        self.bytes -= oldest.size

    def _expire(self, now: float, ttl: float) -> None:
        while self._previous:
            oldest = next(iter(self._previous.values()))
            if now - oldest.at <= ttl:
                return
            self._drop_oldest()


def _against(previous: _Body, body: bytes) -> tuple[_Body, int]:
    """``body`` with its count, and the tokens of its prefix shared with ``previous``.

    Only the two differing tails are scanned: the shared prefix's non-ASCII count is the
    previous body's minus that of its own tail.
    """
    shared = common_prefix_length(previous.data, body)
    prefix_high = previous.high - high_bytes(previous.data[shared:])
    return (
        _Body(body, prefix_high + high_bytes(body[shared:])),
        tokens_from_counts(shared, prefix_high),
    )
