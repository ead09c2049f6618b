"""The stable block: the project's constraints and decisions, after the system prompt.

Decided at the session's start and then fixed for the whole session, so the prompt prefix
before it never changes; a memory edited meanwhile reaches the session as a recall hit.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.injection import STABLE_INTRO, STABLE_KIND, listing
from proxy.injections.base import MemoryReader, Moment, Piece


@dataclass(slots=True)
class StableBlock:
    budget_tokens: int
    read: MemoryReader

    def decide(self, moment: Moment) -> list[Piece]:
        if moment.message is not None:
            return []
        text = listing(STABLE_INTRO, self.read(moment.memory.stable_lines), self.budget_tokens)
        return [Piece(STABLE_KIND, text)] if text else []
