"""Checks that a line-based compressed text is a faithful view of its original.

Every output line must be the next original line, a shortened form of it (start and end kept
around a characters gap, or sentences with sentence gaps), or a gap line whose count says
exactly how many original lines it stands for. Used by the generic and prose tests.
"""

from __future__ import annotations

import re

LINES_GAP = re.compile(r"\[… (\d+) (?:identical )?lines? omitted(?:; they mention: [^\n]*)? …\]")
CHARS_GAP = re.compile(r"\[… (\d+) characters? omitted …\]")
SENTENCES_GAP = re.compile(r" ?\[… (\d+) sentences? omitted …\] ?")


def assert_faithful(original: str, compressed: str) -> list[int]:
    """Walk both texts; return the indices of the original lines the output shows."""
    lines = original.split("\n")
    position = 0
    shown: list[int] = []
    for out in compressed.split("\n"):
        gap = LINES_GAP.fullmatch(out)
        if gap:
            position += int(gap.group(1))
            continue
        assert position < len(lines), f"output runs past the original at {out!r}"
        _assert_same_line(lines[position], out)
        shown.append(position)
        position += 1
    assert position == len(lines), f"gaps account for {position} of {len(lines)} lines"
    return shown


def _assert_same_line(line: str, out: str) -> None:
    if out == line:
        return
    clipped = CHARS_GAP.search(out)
    if clipped:
        head, tail = out[: clipped.start()], out[clipped.end() :]
        assert line.startswith(head) and line.endswith(tail), out
        assert len(head) + int(clipped.group(1)) + len(tail) == len(line), out
        return
    pieces = SENTENCES_GAP.split(out)
    assert len(pieces) > 1, f"{out!r} is not {line!r}"
    kept = [piece for index, piece in enumerate(pieces) if index % 2 == 0 and piece]
    assert line.startswith(kept[0]), out
    for piece in kept:
        assert piece in line, piece
