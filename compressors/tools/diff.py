"""Unified diffs (``git diff``, ``git show``, ``git log -p``, ``diff -u``, a patch tool's echo).

A diff is read like a file: the agent comes back to the lines it changed, the names in them
and the hunk positions. Which lines stay, in this order while the budget lasts: where things
are (``commit`` lines, ``diff --git`` or ``---``/``+++`` and every ``@@`` hunk line, which
carries the line numbers to ask for; at most half the budget), then the changed lines (``+``
and ``-``) that name the most identifiers not shown yet, then author, date and commit
message lines. Context lines and blank changes go first. Each run of left-out lines
becomes one gap line.
"""

from __future__ import annotations

import re

from compressors.markers import gap_line
from compressors.outputs import Budget, Compressed, ToolOutput

MIN_SAVING = 0.2
MIN_LINES = 12
HEADER_SHARE = 0.5  # of the budget, at most, for headers: the rest for changed lines
HUNK = re.compile(r"@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")
_FILE_HEADER = ("diff --git ", "diff -", "--- ", "+++ ", "new file mode", "deleted file")
_PLAIN_HEADER = ("index ", "--- a/", "+++ b/", "--- /dev/null", "+++ /dev/null")
_COMMIT_HEADER = re.compile(r"(?:commit [0-9a-f]{7,40}|Author: |Date: |Merge: )")
LINE_CAP = 300  # a kept line longer than this is cut
_NAME = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")


def is_diff(text: str) -> bool:
    """A unified diff: at least one hunk line and a file header before it."""
    hunk = HUNK.search(text)
    if hunk is None:
        return False
    before = text[: hunk.start()]
    return "diff --git " in before or ("\n--- " in f"\n{before}" and "\n+++ " in before)


def recognises(output: ToolOutput, budget: Budget) -> bool:
    text = output.text
    max_chars = budget.file_view_chars or budget.max_chars
    return len(text) > max_chars and text.count("\n") + 1 >= MIN_LINES and is_diff(text)


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    if not recognises(output, budget):
        return None
    text = output.text
    max_chars = budget.file_view_chars or budget.max_chars
    lines = text.split("\n")
    places, messages, changed = _classify(lines)
    kept: set[int] = set()
    spent = 0
    groups = ((places, HEADER_SHARE), (_by_new_names(lines, changed), 1.0), (messages, 1.0))
    for group, share in groups:
        for index in group:
            cost = min(len(lines[index]), LINE_CAP) + 1
            if spent + cost > max_chars * share:
                continue
            kept.add(index)
            spent += cost
    body = _render(lines, sorted(kept))
    if len(body) > len(text) * (1 - MIN_SAVING):
        return None
    changed_total = len(changed)
    changed_shown = sum(1 for index in changed if index in kept)
    omitted = (
        f"{len(lines) - len(kept)} of {len(lines)} diff lines omitted "
        f"({changed_total - changed_shown} of {changed_total} changed lines among them)"
    )
    return Compressed(body, omitted)


def _by_new_names(lines: list[str], changed: list[int]) -> list[int]:
    """Changed lines that name identifiers, most names first; a name counts once, in the
    first line that shows it (in file order among lines that tie)."""
    names = {index: set(_NAME.findall(lines[index][1:LINE_CAP])) for index in changed}
    seen: set[str] = set()
    ordered: list[int] = []
    for index in sorted(changed, key=lambda i: (-len(names[i]), i)):
        new = names[index] - seen
        if new:
            ordered.append(index)
            seen |= new
    return ordered


def _classify(lines: list[str]) -> tuple[list[int], list[int], list[int]]:
    """(where things are: commit, file and hunk lines; author, date and commit message lines;
    changed lines)."""
    places: list[int] = []
    messages: list[int] = []
    changed: list[int] = []
    in_message = False  # the commit message, between a commit header and its first diff
    git = any(line.startswith("diff --git ") for line in lines)
    for index, line in enumerate(lines):
        if git and line.startswith(_PLAIN_HEADER):  # `diff --git a/x b/x` names the file
            in_message = False
        elif line.startswith("commit "):
            places.append(index)
            in_message = True
        elif _COMMIT_HEADER.match(line):
            messages.append(index)
            in_message = True
        elif line.startswith(_FILE_HEADER) or HUNK.match(line):
            places.append(index)
            in_message = False
        elif in_message and not line.startswith(("+", "-")):
            messages.append(index)
        elif line.startswith(("+", "-")):
            changed.append(index)
    return places, messages, changed


def _render(lines: list[str], kept: list[int]) -> str:
    out: list[str] = []
    previous = -1
    for index in [*kept, len(lines)]:
        if index > previous + 1:
            out.append(gap_line(index - previous - 1, "lines"))
        if index < len(lines):
            line = lines[index]
            if len(line) > LINE_CAP:
                line = f"{line[:LINE_CAP]} {gap_line(len(line) - LINE_CAP, 'characters')}"
            out.append(line)
        previous = index
    return "\n".join(out)
