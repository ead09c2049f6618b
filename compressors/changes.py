"""What a request's rewrite changed, one entry per changed item: the compact description behind
the dashboard's request view ("instead of sending X we sent Y").

The transforms fill these in as they change an item, from what they hold anyway (the original's
length, its CCR key, the replacement text); nothing is serialised or copied for them. The text
is the very string that was forwarded, shared, not copied; whoever keeps a change for longer
caps it (``proxy.rewrites``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ChangeKind(StrEnum):
    COMPRESSED = "compressed"  # a tool output replaced by a marker and its compressed view
    DEDUPED = "deduped"  # a repeated tool output replaced by a pointer to the first copy
    REASONING_DROPPED = "reasoning_dropped"  # an earlier turn's reasoning left out
    REMINDER_DROPPED = "reminder_dropped"  # an earlier turn's long system reminder
    CALL_CUT = "call_cut"  # the long strings of an earlier turn's tool-call arguments
    TRANSCRIPT_COMPRESSED = "transcript_compressed"  # tool results inside a compaction's text
    MEMORY_INJECTED = "memory_injected"  # <deep-memory-context> blocks added to a message
    PROMPT_CHANGED = "prompt_changed"  # the summarizer's instructions (a compaction)


SYSTEM_PROMPT = -1  # ``Change.message`` of a top-level system prompt (as ``Item.message``)


@dataclass(slots=True)
class Change:
    """One changed item. ``message``: the wire message (or input item) index as the client
    sent it, ``SYSTEM_PROMPT`` for a top-level system prompt. ``text``: what was forwarded in
    the item's place, or what was added to it (empty when the item went whole)."""

    kind: ChangeKind
    message: int
    chars_before: int
    chars_after: int
    text: str = ""
    tool: str | None = None  # the tool whose output or call it was
    key: str | None = None  # the CCR key the original is kept under (``GET /expand/{key}``)
    keys: tuple[str, ...] = ()  # several originals kept (a compaction transcript's outputs)
    tokens_before: int | None = None  # estimated, where the transform counted them
    tokens_after: int | None = None
    new: bool = True  # decided in this request; False: re-applied as sent before
    blocks: tuple[str, ...] = ()  # the kinds of the memory blocks added

    def capped(self, limit: int) -> Change:
        """This change with at most ``limit`` characters of its text (built field by field:
        ``dataclasses.replace`` costs five times as much, and records cap many)."""
        if len(self.text) <= limit:
            return self
        return Change(
            self.kind,
            self.message,
            self.chars_before,
            self.chars_after,
            self.text[:limit],
            self.tool,
            self.key,
            self.keys,
            self.tokens_before,
            self.tokens_after,
            self.new,
            self.blocks,
        )
