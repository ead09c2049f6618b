"""Expanding a marker's key back to the original: shared by HTTP, MCP and the CLI.

A line range addresses the line numbers the model sees. When the original is a numbered file
view (OpenCode's ``read`` with its ``<path>``/``<content>`` wrapper and ``N: `` lines,
``cat -n``, SWE-agent, Claude Code), ``start_line``/``end_line`` are the numbers shown in the
view, i.e. the file's own line numbers; otherwise they count the lines of the original output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from compressors.markers import normalize_key
from compressors.tools.file_read import shown_line_numbers
from memory.interfaces import Originals

LINE_RANGE_HELP = (
    "start_line/end_line (1-based, inclusive) are the line numbers shown in a file view (the "
    "file's own line numbers, as in '2550: …'); for other outputs, lines of the original text"
)

Problem = Literal["bad_key", "unknown_key", "bad_range", "out_of_range"]


@dataclass(frozen=True, slots=True)
class Expansion:
    key: str
    content: bytes | None  # None: see ``problem`` and ``error``
    error: str | None = None
    problem: Problem | None = None


def expand(
    store: Originals,
    raw_key: str,
    start_line: int | None = None,
    end_line: int | None = None,
) -> Expansion:
    """The original for ``raw_key`` (``ccr:KEY`` or ``KEY``), optionally only lines
    ``start_line``..``end_line`` (see the module docstring for what the numbers mean)."""
    key = normalize_key(raw_key)
    if key is None:
        return Expansion(
            raw_key, None, f"'{raw_key}' is not a deep-memory key (ccr: + 24 hex)", "bad_key"
        )
    problem = range_error(start_line, end_line)
    if problem is not None:
        return Expansion(key, None, problem, "bad_range")
    content = store.get(key)
    if content is None:
        days = store.retention_seconds / 86400
        return Expansion(
            key,
            None,
            f"key ccr:{key} is unknown or expired (originals are kept {days:g} days after "
            "their last use)",
            "unknown_key",
        )
    if start_line is None and end_line is None:
        return Expansion(key, content)
    return _select_lines(key, content, start_line, end_line)


def range_error(start_line: int | None, end_line: int | None) -> str | None:
    for name, value in (("start_line", start_line), ("end_line", end_line)):
        if value is not None and value < 1:
            return f"{name} must be a line number of at least 1, not {value}"
    if start_line is not None and end_line is not None and start_line > end_line:
        return f"start_line {start_line} is after end_line {end_line}"
    return None


def _select_lines(key: str, content: bytes, start: int | None, end: int | None) -> Expansion:
    lines = content.split(b"\n")
    try:
        numbered = shown_line_numbers(content.decode("utf-8", "surrogatepass"))
    except UnicodeDecodeError:
        numbered = None
    asked = f"lines {start or 1}-{end if end is not None else 'end'}"
    if numbered:
        low, high = numbered[0][0], numbered[-1][0]
        chosen = [
            lines[index]
            for number, index in numbered
            if (start is None or number >= start) and (end is None or number <= end)
        ]
        if not chosen:
            return Expansion(
                key,
                None,
                f"{asked}: this file view shows lines {low}-{high} of the file (start_line/"
                "end_line are the line numbers shown in the view)",
                "out_of_range",
            )
        return Expansion(key, b"\n".join(chosen))
    first = start or 1
    last = min(len(lines), end or len(lines))
    if first > last:
        return Expansion(key, None, f"{asked}: the original has {len(lines)} lines", "out_of_range")
    return Expansion(key, b"\n".join(lines[first - 1 : last]))
