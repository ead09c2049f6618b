"""The contract between the pipeline and the per-tool compressors.

A per-tool compressor is one pure function ``(ToolOutput, Budget) -> Compressed | None``. It
returns None when the output is not of its kind (the registry then tries the next candidate)
or when it cannot make the output meaningfully smaller. It never adds the marker line: the
pipeline does, with the key of the original it stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import orjson


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """One tool result, with the call that produced it."""

    text: str
    tool: str = ""  # the tool name exactly as the agent called it
    arguments: str = ""  # the call's arguments as JSON text, '' when unknown
    focus: frozenset[str] = frozenset()  # words of the session's task (``focus.task_terms``)

    @property
    def tool_key(self) -> str:
        return self.tool.strip().lower()


@dataclass(frozen=True)
class CallArguments:
    """The parsed arguments of a call, tolerant of arguments that are not JSON."""

    raw: str

    @cached_property
    def parsed(self) -> dict[str, object]:
        try:
            value = orjson.loads(self.raw) if self.raw else {}
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}

    def text(self, *names: str) -> str:
        """The first of ``names`` that holds a string."""
        for name in names:
            value = self.parsed.get(name)
            if isinstance(value, str):
                return value
        return ""


@dataclass(frozen=True, slots=True)
class Budget:
    """How small the compressed text should be.

    ``max_chars`` is a target, not a hard cap: a compressor may exceed it slightly to keep a
    line whole, but should keep the most important content within it. ``level`` is 1 for the
    normal compression and 2+ for deeper re-compression under pressure.
    """

    max_chars: int
    level: int = 1
    file_view_chars: int = 0  # the budget for a file view, 0: same as max_chars


@dataclass(frozen=True, slots=True)
class Compressed:
    """The kept content, with gaps shown by ``markers.gap_line``, and what was left out.

    ``omitted`` completes the sentence "[deep-memory: <omitted> — original intact: ...]", e.g.
    "412 of 480 lines omitted" or "38 of 40 array items omitted".
    """

    text: str
    omitted: str


CompressFn = Callable[[ToolOutput, Budget], Compressed | None]
RecogniseFn = Callable[[ToolOutput, Budget], bool]
