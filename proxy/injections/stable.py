"""The stable block: the project's constraints and decisions, after the system prompt.

Decided at the session's start and then fixed for the whole session, so the prompt prefix
before it never changes; a memory edited meanwhile reaches the session as a recall hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.injection import STABLE_INTRO, STABLE_KIND, listing
from proxy.injections.base import MemoryReader, Moment, Piece
from proxy.options import Option, parse_non_negative_int

OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_stable_tokens",
        parse_non_negative_int,
        600,
        "Token budget of the stable block in the system prompt (0: no stable block).",
        "TOKENS",
    ),
)


@dataclass(slots=True)
class StableBlock:
    budget_tokens: int
    read: MemoryReader

    def decide(self, moment: Moment) -> list[Piece]:
        if moment.message is not None:
            return []
        text = listing(STABLE_INTRO, self.read(moment.memory.stable_lines), self.budget_tokens)
        return [Piece(STABLE_KIND, text)] if text else []
