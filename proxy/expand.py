"""Expanding a marker's key back to the original: shared by HTTP, MCP and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from compressors.markers import normalize_key
from memory.ccr import OriginalStore


@dataclass(frozen=True, slots=True)
class Expansion:
    key: str
    content: bytes | None  # None: unknown or expired
    error: str | None = None


def expand(
    store: OriginalStore,
    raw_key: str,
    start_line: int | None = None,
    end_line: int | None = None,
) -> Expansion:
    """The original for ``raw_key`` (``ccr:KEY`` or ``KEY``), optionally lines start..end
    (1-based, inclusive)."""
    key = normalize_key(raw_key)
    if key is None:
        return Expansion(raw_key, None, f"'{raw_key}' is not a deep-memory key (ccr: + 24 hex)")
    content = store.get(key)
    if content is None:
        days = store.retention_seconds / 86400
        return Expansion(
            key,
            None,
            f"key ccr:{key} is unknown or expired (originals are kept {days:g} days after "
            "their last use)",
        )
    if start_line is None and end_line is None:
        return Expansion(key, content)
    lines = content.split(b"\n")
    first = max(1, start_line or 1)
    last = min(len(lines), end_line or len(lines))
    if first > last:
        return Expansion(key, None, f"lines {first}-{last}: the original has {len(lines)} lines")
    return Expansion(key, b"\n".join(lines[first - 1 : last]))
