"""The grammar of OpenCode's compaction transcript, read in one place.

OpenCode hands its summarizer the conversation as text inside ``<conversation>``, one block
per message part, each starting a line with its label:

    [User]: make the tests pass
    [Assistant reasoning]: …
    [Assistant tool call]: read({"filePath": "/repo/a.py"})
    [Tool result]: …
    [Tool error]: …
    [Assistant]: …

A block runs to the start of the next one, so a tool result keeps all its lines. The
compressor (``compressors.transcript``) and the checkpoint extractor (``memory.checkpoint``)
both read transcripts through this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

OPEN, CLOSE = "<conversation>", "</conversation>"


class Label(StrEnum):
    USER = "User"
    ASSISTANT = "Assistant"
    REASONING = "Assistant reasoning"
    TOOL_CALL = "Assistant tool call"
    TOOL_RESULT = "Tool result"
    TOOL_ERROR = "Tool error"

    @property
    def head(self) -> str:
        """What starts a block of this label: ``[Tool result]: ``."""
        return f"[{self.value}]: "


_BLOCK_START = re.compile(
    r"^\[(" + "|".join(re.escape(label.value) for label in Label) + r")\]: ", re.MULTILINE
)
# ``name(arguments)``: the name is everything before the first parenthesis, the arguments
# everything up to the last one.
_TOOL_CALL = re.compile(r"^\s*([^\s(]+)\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Block:
    """One labelled block of a conversation body; ``body[start:end]`` is its exact text."""

    label: Label
    start: int  # where its ``[Label]: `` begins
    end: int  # where the next block begins, or the body ends
    text: str  # what follows ``[Label]: ``, up to ``end`` (trailing newlines included)


def conversation_span(text: str) -> tuple[int, int] | None:
    """Where the transcript lies in ``text``: from after the first ``<conversation>`` to the
    last ``</conversation>``; None unless both are there, in that order."""
    opening = text.find(OPEN)
    closing = text.rfind(CLOSE)
    if opening < 0 or closing <= opening:
        return None
    return opening + len(OPEN), closing


def blocks(body: str) -> list[Block]:
    """The labelled blocks of a conversation body, in order; text before the first is none."""
    starts = list(_BLOCK_START.finditer(body))
    ends = [found.start() for found in starts[1:]] + [len(body)] if starts else []
    return [
        Block(Label(found[1]), found.start(), end, body[found.end() : end])
        for found, end in zip(starts, ends, strict=True)
    ]


def tool_call(text: str) -> tuple[str, str]:
    """The tool name and arguments of a ``[Assistant tool call]`` block's text; a text that
    is not ``name(arguments)`` is all name, with no arguments."""
    found = _TOOL_CALL.match(text)
    return (found[1], found[2]) if found else (text.strip(), "")
