"""The text deepmem puts in front of the model: delimiters, defanging, remembered lines.

Every injected block is wrapped in one delimiter pair, ``<deep-memory-context kind="…">`` …
``</deep-memory-context>``. Memory content is written by people and by models, so before it
is placed inside a block every ``<deep-memory…`` / ``</deep-memory…`` in it is defanged (its
``<`` becomes the fullwidth U+FF1C): stored text can neither close a block early nor open a
block of its own. The tag is looked for in a normalised view of the text (NFKC, Unicode
default-ignorable code points removed, hyphen-like characters read as ``-``), so
``</deep\u200b-memory-context>``, a soft hyphen, U+2010 or a fullwidth solidus are caught too;
the ``<`` that starts the match in the original text is the one replaced.

Rendering is deterministic (same entries and budget, same bytes); the caller memoises the
result per session so a block, once sent, is re-sent byte for byte.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from compressors.tokens import estimate_tokens

TAG = "deep-memory-context"
DEFANGED_LT = "\uff1c"
# "deep memory" with or without its hyphen: an ignorable one (a soft hyphen) is dropped.
_FORGEABLE = re.compile(r"<(?=\s*/?\s*deep[\s-]*memory)", re.IGNORECASE)
# Unicode's Default_Ignorable_Code_Point: invisible, so a reader (or a model) skips them.
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
_HYPHENS = str.maketrans(
    dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212\ufe58\ufe63\uff0d", "-")
)


def normalised_view(text: str) -> tuple[str, list[int]]:
    """``text`` as the tag is matched in, and for each of its characters the index of the
    character of ``text`` it comes from (NFKC per character, ignorables dropped)."""
    chars: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        if char.isascii():
            chars.append(char)
            origin.append(index)
            continue
        if _IGNORABLE.match(char):
            continue
        for part in unicodedata.normalize("NFKC", char).translate(_HYPHENS):
            if not _IGNORABLE.match(part):
                chars.append(part)
                origin.append(index)
    return "".join(chars), origin


def defang(text: str) -> str:
    """Neutralise anything in ``text`` that could read as one of our delimiters."""
    if text.isascii():
        return _FORGEABLE.sub(DEFANGED_LT, text)
    # A delimiter begins with "<", and no character normalises to one unless its compatibility
    # decomposition holds one: most remembered lines (a dash, an arrow, Chinese) are let
    # through without the character by character view.
    if "<" not in unicodedata.normalize("NFKD", text):
        return text
    view, origin = normalised_view(text)
    starts = {origin[match.start()] for match in _FORGEABLE.finditer(view)}
    if not starts:
        return text
    return "".join(DEFANGED_LT if i in starts else char for i, char in enumerate(text))


def wrap(kind: str, body: str) -> str:
    return f'<{TAG} kind="{kind}">\n{body}\n</{TAG}>'


_BLOCK_START = re.compile(f'<{TAG} kind="([^"]*)">')


def block_kinds(text: str) -> tuple[str, ...]:
    """The kinds of the blocks ``wrap`` made in ``text``, in order (remembered text is
    defanged, so no copy of the tag inside a block is read as one)."""
    return tuple(_BLOCK_START.findall(text))


@dataclass(frozen=True, slots=True)
class Line:
    """One remembered line to show: its text, where it comes from and its date."""

    text: str
    source: str  # "Constraints", "Decisions", "notes", "checkpoint: File Changes", ...
    date: str | None = None

    def render(self) -> str:
        dated = f" [{self.date}]" if self.date else ""
        return f"- ({defang(self.source)}) {defang(self.text)}{dated}"


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


STABLE_KIND, RECALL_KIND, RESUME_KIND = "project-memory", "recall", "resume"
STABLE_INTRO = (
    "Project memory kept by deepmem (.deep-memory/MEMORY.md): constraints and decisions "
    "recorded in earlier sessions. Follow them unless the user says otherwise."
)
RECALL_INTRO = (
    "deepmem found these remembered notes relevant to the message above. They come from "
    "earlier sessions and may be out of date; prefer what the user says now."
)


def listing(intro: str, lines: Sequence[Line], budget_tokens: int) -> str:
    """``intro`` and the rendered lines that fit the budget (with the block's delimiters);
    "" when none fits."""
    shown = fit(lines, budget_tokens, intro + TAG * 2)
    return "\n".join([intro, *shown]) if shown else ""


def stable_block(lines: Sequence[Line], budget_tokens: int) -> str:
    """The session's system-prompt block, or "" when nothing fits or there is nothing."""
    text = listing(STABLE_INTRO, lines, budget_tokens)
    return wrap(STABLE_KIND, text) if text else ""
