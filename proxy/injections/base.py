"""The interface every kind of injected text implements, and how a moment's pieces compose.

An ``Injection`` is asked once at each new point of a session (a ``Moment``): the session's
start, where the system prompt may gain a block, and each user message the proxy sees for the
first time. It answers with ``Piece``s, each naming the delimited block it is shown in. The
memory addon (``proxy/memory_stage.py``) composes the pieces of one moment into text, memoises
that text and re-sends it byte for byte on every later request; no injection runs twice for
the same message."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from compressors.changes import Change, ChangeKind
from compressors.tokens import estimate_tokens
from memory.catalog import ProjectMemory
from memory.injection import Line, block_kinds, wrap
from memory.injection_memo import SessionInjections
from proxy.flow import Flow
from proxy.health import Health
from proxy.sessions import Tally

if TYPE_CHECKING:
    from compressors.view import Conversation

log = logging.getLogger("deepmem.memory")


@dataclass(slots=True)
class MemoryReport:
    """What the memory addon did to one request; each injection fills in its own fields."""

    project: Path | None
    project_reason: str  # why the project was accepted, or why none was
    new_turn: bool = False
    hits: int = 0  # remembered lines shown beside the new user message
    captured: bool = False
    nudges: tuple[str, ...] = ()  # the kinds of reminder given with a new user message
    resumed: str = ""  # the tag of the checkpoint the new user message resumes, if any
    notes: list[str] = field(default_factory=list)
    # Each wire message (as it arrived) the blocks went to, their text, and whether they were
    # decided in this request (not re-applied). What they come to, their tokens and changes,
    # is worked out when the request is counted, once its answer is out.
    injected: list[tuple[int, str, bool]] = field(default_factory=list)

    @property
    def injected_tokens(self) -> int:
        """Estimated tokens this request carries because of memory blocks."""
        return sum(estimate_tokens(text) for _, text, _ in self.injected)

    def changes(self) -> list[Change]:
        return [
            Change(
                ChangeKind.MEMORY_INJECTED,
                message,
                0,
                len(text),
                text,
                tokens_before=0,
                tokens_after=estimate_tokens(text),
                new=new,
                blocks=block_kinds(text),
            )
            for message, text, new in self.injected
        ]

    def inject(self, message: int, text: str, new: bool) -> None:
        """Note ``text`` (memory blocks) added to wire message ``message`` (``new``: decided
        in this request, not re-applied)."""
        self.injected.append((message, text, new))

    def account(self, tally: Tally) -> None:
        tally.tokens_injected += self.injected_tokens
        if self.new_turn:
            tally.memory_turns += 1
            tally.memory_hits += self.hits
            tally.memory_nudges += len(self.nudges)
            tally.memory_captures += self.captured


@dataclass(slots=True)
class Moment:
    """A new point of a session: its start, or a user message seen for the first time."""

    conversation: Conversation
    flow: Flow
    memory: ProjectMemory
    memo: SessionInjections  # what earlier moments of the session injected
    users: list[tuple[int, str]]  # every user message of the request: (message index, text)
    report: MemoryReport  # where an injection says what it did
    message: int | None = None  # the new message's position in ``users``; None: the start
    newest: bool = False  # the new message is the request's newest one
    shown: list[Piece] = field(default_factory=list)  # what the kinds before decided here

    @property
    def text(self) -> str:
        """The new user message's text ("" at the session's start)."""
        return "" if self.message is None else self.users[self.message][1]


@dataclass(frozen=True, slots=True)
class Piece:
    """Text for one block: ``block`` names it (``<deep-memory-context kind="…">``); ``text``
    is already defanged. ``tag`` is remembered with the message, so that later moments can
    see what was given and when (a nudge's cooldown, a checkpoint resumed once)."""

    block: str
    text: str
    tag: str = ""


class Injection(Protocol):
    """One kind of injected text."""

    def decide(self, moment: Moment) -> list[Piece]:
        """What this kind adds at ``moment`` (often nothing). Called once per moment; the
        result is memoised with the message, so it may read files and search."""


def compose(pieces: list[Piece]) -> tuple[str, tuple[str, ...]]:
    """The text of a moment's pieces, one block per block name in order of first appearance,
    and their tags."""
    blocks: dict[str, list[str]] = {}
    for piece in pieces:
        blocks.setdefault(piece.block, []).append(piece.text)
    text = "\n\n".join(wrap(block, "\n\n".join(texts)) for block, texts in blocks.items())
    return text, tuple(piece.tag for piece in pieces if piece.tag)


@dataclass(slots=True)
class MemoryReader:
    """Reads lines from the memory files; a failure is reported to /health, not raised."""

    health: Health | None = None

    def __call__(self, read: Callable[[], list[Line]]) -> list[Line]:
        try:
            lines = read()
        except (OSError, ValueError) as exc:
            log.warning("cannot read the memory files: %s", exc)
            if self.health is not None:
                self.health.report("memory_reads", f"cannot read the memory files: {exc}")
            return []
        if self.health is not None:
            self.health.clear("memory_reads")
        return lines
