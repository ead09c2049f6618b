"""The text deepmem puts in front of the model: the stable block, recalled hits and nudges.

Every injected block is wrapped in one delimiter pair, ``<deep-memory-context kind="…">`` …
``</deep-memory-context>``. Memory content is written by people and by models, so before it
is placed inside a block every ``<deep-memory…`` / ``</deep-memory…`` in it is defanged (its
``<`` becomes the fullwidth U+FF1C): stored text can neither close a block early nor open a
block of its own.

Rendering is deterministic (same entries and budget, same bytes); the caller memoises the
result per session so a block, once sent, is re-sent byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compressors.tokens import estimate_tokens

TAG = "deep-memory-context"
_FORGEABLE = re.compile(r"<(?=\s*/?\s*deep-memory)", re.IGNORECASE)


def defang(text: str) -> str:
    """Neutralise anything in ``text`` that could read as one of our delimiters."""
    return _FORGEABLE.sub("\uff1c", text)


def wrap(kind: str, body: str) -> str:
    return f'<{TAG} kind="{kind}">\n{body}\n</{TAG}>'


@dataclass(frozen=True, slots=True)
class Line:
    """One remembered line to show: its text, where it comes from and its date."""

    text: str
    source: str  # "Constraints", "Decisions", "notes", "checkpoint: File Changes", ...
    date: str | None = None

    def render(self) -> str:
        dated = f" [{self.date}]" if self.date else ""
        return f"- ({self.source}) {defang(self.text)}{dated}"


def fit(lines: Iterable[Line], budget_tokens: int, overhead: str) -> list[str]:
    """Rendered lines, in order, while the block (with ``overhead`` text) fits the budget."""
    used = estimate_tokens(overhead)
    out: list[str] = []
    for line in lines:
        rendered = line.render()
        cost = estimate_tokens(rendered) + 1
        if used + cost > budget_tokens:
            break
        out.append(rendered)
        used += cost
    return out


STABLE_INTRO = (
    "Project memory kept by deepmem (.deep-memory/MEMORY.md): constraints and decisions "
    "recorded in earlier sessions. Follow them unless the user says otherwise."
)
RECALL_INTRO = (
    "deepmem found these remembered notes relevant to the message above. They come from "
    "earlier sessions and may be out of date; prefer what the user says now."
)


def stable_block(lines: Sequence[Line], budget_tokens: int) -> str:
    """The session's system-prompt block, or "" when nothing fits or there is nothing."""
    shown = fit(lines, budget_tokens, STABLE_INTRO + TAG * 2)
    return wrap("project-memory", "\n".join([STABLE_INTRO, *shown])) if shown else ""


def recall_block(lines: Sequence[Line], budget_tokens: int, nudges: Sequence[str] = ()) -> str:
    """Hits (and nudges) for one user message, or "" when there is nothing to add."""
    parts: list[str] = []
    shown = fit(lines, budget_tokens, RECALL_INTRO + TAG * 2)
    if shown:
        parts.append("\n".join([RECALL_INTRO, *shown]))
    parts.extend(defang(nudge) for nudge in nudges)
    return wrap("recall", "\n\n".join(parts)) if parts else ""
