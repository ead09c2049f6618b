"""Choosing which lines of an output to keep, and rendering them with gap lines.

Most per-tool compressors are a scoring of lines plus this: the head and tail are kept, then
the highest-scoring lines until the budget is spent, and the result is shown in the original
order with one gap line per run of left-out lines.
"""

from __future__ import annotations

from collections.abc import Sequence

from compressors.markers import gap_line

GAP_COST = 28  # characters a gap line takes, near enough


def select_lines(
    lines: Sequence[str],
    scores: Sequence[float],
    max_chars: int,
    head: int = 0,
    tail: int = 0,
) -> list[int]:
    """Indices of the lines to keep, ascending.

    Head and tail lines come first (as far as the budget allows), then lines by descending
    score (ties: earlier first). Lines scoring 0 or less are kept only as head or tail.
    """
    count = len(lines)
    kept: set[int] = set()
    spent = 0

    def take(index: int) -> bool:
        nonlocal spent
        cost = len(lines[index]) + 1 + GAP_COST // 2
        if spent + cost > max_chars and kept:
            return False
        kept.add(index)
        spent += cost
        return True

    for index in range(min(head, count)):
        if not take(index):
            break
    for index in range(max(count - tail, 0), count):
        if index not in kept and not take(index):
            break
    ranked = sorted(
        (index for index in range(count) if scores[index] > 0 and index not in kept),
        key=lambda index: (-scores[index], index),
    )
    for index in ranked:
        take(index)
    return sorted(kept)


def render(lines: Sequence[str], kept: Sequence[int], unit: str = "lines") -> str:
    """The kept lines in order, with a gap line wherever lines were left out."""
    out: list[str] = []
    previous = -1
    for index in kept:
        if index > previous + 1:
            out.append(gap_line(index - previous - 1, unit))
        out.append(lines[index])
        previous = index
    if previous < len(lines) - 1:
        out.append(gap_line(len(lines) - 1 - previous, unit))
    return "\n".join(out)


def omitted_phrase(total: int, kept: int, unit: str = "lines") -> str:
    return f"{total - kept} of {total} {unit} omitted"
