"""The one line-level grammar of memory Markdown files (MEMORY.md, notes.md, checkpoints).

A file is a preamble followed by one section per ``## `` heading. Inside a section an *item*
is a bullet (``-``, ``*``, ``+``, ``1.`` or ``1)``) together with the indented lines that
continue it, or any other non-blank line that is not a heading. An item's text may end in a
date tag ``[YYYY-MM-DD]``. ``memory.store`` (the editable MEMORY.md model) and
``memory.search`` (the BM25 documents) both read files through this module.

Choices (each pinned in ``tests/memory/test_markdown.py``):
- Lines are split on ``\\n`` only, and a trailing ``\\r`` is dropped when the file uses CRLF:
  ``str.splitlines`` would also break on U+2028, form feeds and the like, so line numbers
  would not match an editor's or ``grep -n``'s and the store could not round-trip the file.
- A section heading is ``##`` at column 0, whitespace, then the title; an optional closing
  run of ``#`` is dropped only when whitespace precedes it (``## C#`` keeps its ``#``).
- Ordered-list items (``1.``, ``1)``; up to 9 digits, as in CommonMark) are bullets too.
- Other headings (``#`` to ``######`` then whitespace or end of line) are never items and end
  a bullet; ``#tag`` without the space is text.
- A date tag counts only if it is a real calendar date and some text precedes it; otherwise
  it stays part of the text. A bullet with no text at all is not an item.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import date
from typing import NamedTuple

CRLF = "\r\n"

_SECTION = re.compile(r"##\s+(?P<title>.*?)(?:\s+#+)?\s*$")
# the rest are matched against a stripped line
_HEADING = re.compile(r"#{1,6}(?:\s|$)")
_BULLET_MARKS = "-*+"
_BULLET_STARTS = "-*+0123456789"
_ORDERED = re.compile(r"[0-9]{1,9}[.)](?:\s|$)")
_DATE_TAG = re.compile(r"\[([0-9]{4}-[0-9]{2}-[0-9]{2})\]$")
_LEADING_DATE = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})(?:[T ]|$)")


class Item(NamedTuple):
    """A bullet with its continuation lines, or one other non-blank, non-heading line."""

    line: int  # 1-based line number of the first line
    parts: tuple[str, ...]  # stripped text of each line, bullet marker removed
    bullet: bool

    @property
    def span(self) -> int:
        """How many lines the item covers."""
        return len(self.parts)

    @property
    def text(self) -> str:
        """All parts joined by single spaces."""
        parts = self.parts
        return parts[0] if len(parts) == 1 else " ".join(filter(None, parts))


@dataclass(slots=True)
class Section:
    """The preamble (``heading`` None) or one ``## `` section, with its raw body lines."""

    heading: str | None  # the heading line as written
    title: str | None
    line: int  # 1-based line number of the heading; 0 for the preamble
    lines: list[str] = field(default_factory=list)  # without line endings

    @property
    def start(self) -> int:
        """1-based line number of the first body line."""
        return self.line + 1

    def items(self) -> list[Item]:
        """The section's items in file order."""
        found: list[Item] = []
        parts: list[str] = []  # the open bullet's parts; empty when none is open
        first = 0  # line number of the open bullet
        for number, line in enumerate(self.lines, self.start):
            stripped = line.strip()
            if not stripped or (stripped[0] == "#" and _HEADING.match(stripped)):
                if parts:
                    _close(found, first, parts)
                    parts = []
                continue
            body = _bullet_body(stripped) if stripped[0] in _BULLET_STARTS else None
            if body is None and parts and line[0].isspace():
                parts.append(stripped)
                continue
            if parts:
                _close(found, first, parts)
                parts = []
            if body is None:
                found.append(Item(number, (stripped,), False))
            else:
                parts, first = [body], number
        if parts:
            _close(found, first, parts)
        return found


def _bullet_body(stripped: str) -> str | None:
    """The text after the bullet marker of a stripped line; None if it is no bullet."""
    if stripped[0] in _BULLET_MARKS:
        if len(stripped) == 1:
            return ""
        return stripped[1:].lstrip() if stripped[1].isspace() else None
    match = _ORDERED.match(stripped)
    return stripped[match.end() :].lstrip() if match else None


def _close(found: list[Item], first: int, parts: list[str]) -> None:
    """Add the bullet that just ended to ``found``."""
    if parts[0] or len(parts) > 1:  # a bare marker with nothing after it is no item
        found.append(Item(first, tuple(parts), True))


def newline_of(text: str) -> str:
    """The file's line ending: CRLF if it uses CRLF anywhere, else LF."""
    return CRLF if CRLF in text else "\n"


def split_lines(text: str) -> list[str]:
    """The file's lines without their endings (see the module docstring)."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if CRLF in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return lines


def parse(text: str) -> list[Section]:
    """The preamble (always present, maybe empty), then one section per ``## `` heading."""
    return list(iter_sections(text))


def iter_sections(text: str) -> Iterator[Section]:
    """``parse``, one section at a time."""
    # Yielding each section as soon as it ends lets a reader that keeps only what it derives
    # (search) drop the sections young, so they never pile up in the GC's oldest generation.
    section = Section(None, None, 0, [])
    body = section.lines
    for number, line in enumerate(split_lines(text), 1):
        if line.startswith("##"):
            # the common `## Title` needs no regex
            if line.startswith("## ") and line.find("#", 3) < 0:
                title: str | None = line[3:].strip()
            else:
                match = _SECTION.match(line)
                title = match["title"] if match else None
            if title is not None:
                yield section
                section = Section(line, title, number, [])
                body = section.lines
                continue
        body.append(line)
    yield section


def split_date(text: str) -> tuple[str, date | None]:
    """``text`` stripped and without its trailing ``[YYYY-MM-DD]`` tag, and the tag's date."""
    text = text.strip()
    if not text.endswith("]"):
        return text, None
    match = _DATE_TAG.search(text)
    if match is None:
        return text, None
    rest = text[: match.start()].rstrip()
    when = to_date(match.group(1))
    if not rest or when is None:
        return text, None
    return rest, when


def leading_date(text: str) -> date | None:
    """The date an ISO timestamp at the start of ``text`` (a notes.md heading) names."""
    match = _LEADING_DATE.match(text)
    return to_date(match.group(1)) if match else None


def to_date(text: str) -> date | None:
    """``YYYY-MM-DD`` as a date; None if it is not a calendar date."""
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None
