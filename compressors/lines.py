"""What the line-based compressors share: how gaps are rendered."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compressors.markers import gap_line


def with_gaps(
    lines: Sequence[str],
    kept: Sequence[int],
    gap: Callable[[int], str] = gap_line,
) -> list[str]:
    """The kept lines in order (``kept`` ascending), with ``gap(count)`` wherever lines were
    left out, including before the first and after the last kept line."""
    out: list[str] = []
    previous = -1
    for index in kept:
        if index > previous + 1:
            out.append(gap(index - previous - 1))
        out.append(lines[index])
        previous = index
    if previous < len(lines) - 1:
        out.append(gap(len(lines) - 1 - previous))
    return out
