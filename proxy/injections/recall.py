"""Recall: remembered lines that match a new user message, shown beside it.

Searched once per new user message (never per step); lines the stable block or the same
message's resume block already shows are left out. A session's first message gets a larger budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from memory.injection import RECALL_INTRO, RECALL_KIND, TAG, defang, fit
from proxy.injections.base import MemoryReader, Moment, Piece
from proxy.options import Option, parse_non_negative_int

MAX_HITS = 5


OPTIONS: tuple[Option, ...] = (
    Option(
        "memory_recall_tokens",
        parse_non_negative_int,
        400,
        "Token budget of the search hits added beside a new user message (0: no hits).",
        "TOKENS",
    ),
    Option(
        "memory_first_recall_tokens",
        parse_non_negative_int,
        1000,
        "Token budget of the hits on the first user message of a session.",
        "TOKENS",
    ),
)


@dataclass(slots=True)
class Recall:
    first_budget_tokens: int
    budget_tokens: int
    read: MemoryReader

    def decide(self, moment: Moment) -> list[Piece]:
        if not moment.newest:
            return []
        budget = self.first_budget_tokens if moment.memo.turns == 0 else self.budget_tokens
        if not budget:
            return []
        # A line the stable block or this message's resume block already shows is not repeated.
        given = "\n".join([moment.memo.stable or "", *(piece.text for piece in moment.shown)])
        found = self.read(lambda: moment.memory.recall(moment.text, MAX_HITS))
        lines = [line for line in found if defang(line.text) not in given]
        shown = fit(lines, budget, RECALL_INTRO + TAG * 2)
        moment.report.hits = len(shown)
        return [Piece(RECALL_KIND, "\n".join([RECALL_INTRO, *shown]))] if shown else []
