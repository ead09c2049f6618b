"""Long natural-language and markdown outputs: subagent reports, fetched web pages, docs.

Lines are kept by their part in the document, most important first: headings (higher levels
first; a deep heading only when something of its section is kept), the first line of each
section, list items that carry code spans, paths, numbers or words like error / must / todo /
fixed / because, the first line of each code block (with its fences and language), the first
line of every other paragraph, table headers, then any line by how many identifiers it
carries. Lines under a Summary, Conclusion, Cause or Fix heading rank higher; the head and
the closing lines (the conclusion) are kept too, and every kept line keeps the headings above
it. A paragraph written as one long line keeps its first sentence and the sentences that
carry signals, and says how many sentences it left out.

Prose tools (``task``, ``agent``, ``webfetch`` …) are always compressed unless they returned
JSON; any other output only when it reads as prose or markdown (not code, logs or JSON).
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress as where
from itertools import repeat
from operator import add, gt

from compressors.markers import gap_line
from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.tools.generic import (
    LineFacts,
    analyse_lines,
    choose,
    choose_with_names,
    clip_line,
    names_by_gap,
    render_kept,
    score_lines,
)

MIN_CHARS = 400
MAX_RATIO = 0.8  # a result is kept only when it saves at least 20%
# Shares of the budget for the first and the last lines: the title and intro, the conclusion
# (pages often end in footers, so less than a log's tail)
SHARES = (0.1, 0.1)
PROSE_TOOLS = frozenset(
    {"task", "agent", "subagent", "webfetch", "web_fetch", "fetch", "websearch", "web_search",
     "browser", "browse"}
)  # fmt: skip
SAMPLE_LINES = 300  # lines that decide whether an output of another tool is prose
SAMPLE_CHARS = 24_000  # and at most this much of them
MIN_LINE_CAP = 240  # a long line keeps at least this much
MAX_PARAGRAPH = 50_000  # a longer line is not a paragraph: it is clipped, not split
PLAIN_WORD = re.compile(r"[A-Za-z][a-z'\u2019-]*[,.;:!?)]?$")

# Scores: what is kept first when the budget is short.
HEADING = 100.0  # minus HEADING_STEP per level
HEADING_STEP = 12.0  # h1 88, h2 76 … h5 40, h6 28: an error line outranks deep headings
FENCE = 0.0  # kept with the code lines of its block, see _whole_fences
FIRST_CODE_LINE = 30.0
LEAD_LINE = 32.0  # the first line of a section
FIRST_LINE = 28.0  # of any other paragraph
SIGNAL_ITEM = 34.0  # a list item that carries a code span, path, number or keyword
TABLE_HEAD = 26.0
PLAIN_ITEM = 6.0
OTHER = 1.0  # plus the line's identifier density
KEY_SECTION_BONUS = 10.0  # for lines under a Summary, Conclusion, Root cause, Fix … heading
SIGNAL_WORDS = re.compile(
    r"\b(?:error|errors|fail\w*|must|should|todo|fixme|fixed|fix|because|bug|warning|note|"
    r"important|breaking|deprecated|required|cause|instead|never)\b",
    re.IGNORECASE,
)
# Prose mentions errors less often than logs: a few words keep the scan short.
ERROR_WORDS = (b"error", b"fail", b"exception", b"traceback", b"fatal", b"warning")
SIGNAL_CHARS = ("`", "/", "_", "::", "()", ".py", ".ts", ".js", ".go", ".rs")
DIGIT = re.compile(r"\d")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9`\"'(\[*_])")


def recognises(output: ToolOutput, budget: Budget) -> bool:
    text = output.text
    if len(text) < MIN_CHARS or len(text) <= budget.max_chars:
        return False
    if output.tool_key in PROSE_TOOLS:
        return not _looks_like_json(text)  # the JSON compressor, tried next, does better
    return looks_like_prose(text)


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    if not recognises(output, budget):
        return None
    return _compress(output.text, budget.max_chars, output.focus)


def _looks_like_json(text: str) -> bool:
    return text[:256].lstrip()[:1] in ("{", "[") and text[-256:].rstrip()[-1:] in ("}", "]")


# --- recognising prose ----------------------------------------------------------------------


def looks_like_prose(text: str) -> bool:
    """Whether most lines of the output's start are sentences, headings or list items, and
    its sentences end like sentences (code, logs and JSON do not)."""
    prose = structure = sentences = other = 0
    fenced = False
    for line in text[:SAMPLE_CHARS].split("\n", SAMPLE_LINES)[:SAMPLE_LINES]:
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced or not stripped:
            continue
        kind = _kind(stripped)
        if kind in ("heading", "item", "table"):
            structure += 1
        elif _is_sentence_line(stripped):
            prose += 1
            sentences += stripped[-1] in ".!?:" or ". " in stripped
        else:
            other += 1
    words = prose + structure
    return (
        words >= 5
        and words >= 2 * other
        and prose + structure // 2 >= 3
        and (sentences * 3 >= prose or structure >= prose)
    )


def _is_sentence_line(stripped: str) -> bool:
    if stripped[0].isdigit():
        return False
    tokens = stripped.split()
    if len(tokens) < 5:
        return False
    plain = sum(1 for token in tokens if PLAIN_WORD.match(token))
    return plain * 5 >= len(tokens) * 3


_ITEM = re.compile(r"(?:[-*+•]|\d{1,3}[.)])\s")
_HEADING = re.compile(r"#{1,6}\s")
_UNDERLINE = re.compile(r"={3,}|-{3,}")
_KEY_SECTION = re.compile(
    r"summary|conclusion|finding|result|cause|answer|recommend|fix|solution|tl;?dr|overview",
    re.IGNORECASE,
)


def _kind(stripped: str) -> str:
    first = stripped[0]
    if first == "#" and _HEADING.match(stripped):
        return "heading"
    if first == "|":
        return "table"
    if _ITEM.match(stripped):
        return "item"
    return "text"


# --- compressing ----------------------------------------------------------------------------


@dataclass(slots=True)
class Shortened:
    """What was cut inside kept lines."""

    sentences: int = 0
    characters: int = 0
    lines: int = 0  # kept lines that were shortened


def _compress(text: str, max_chars: int, focus: frozenset[str]) -> Compressed | None:
    lines = text.split("\n")
    facts = analyse_lines(text, lines, ERROR_WORDS, focus)
    parts = _parts(lines)
    cap = max(MIN_LINE_CAP, max_chars // 8)
    shown = list(lines)
    cuts: dict[int, tuple[int, int]] = {}  # line → (sentences, characters) cut from it
    for index in where(range(len(lines)), map(gt, map(len, lines), repeat(cap))):
        code = parts.kinds[index] in ("code", "first-code")
        shown[index], sentences, characters = _shorten(lines[index], cap, code)
        if sentences or characters:
            cuts[index] = (sentences, characters)
    scores = _scores(shown, parts, facts)
    _demote_empty_sections(parts, scores, choose(shown, scores, max_chars, SHARES))
    kept, names = choose_with_names(shown, scores, max_chars, SHARES)
    kept = _with_blank_separators(lines, _whole_fences(parts, _with_headings(parts, kept)))
    body = render_kept(shown, kept, None, names_by_gap(kept, names))
    if len(body) > len(text) * MAX_RATIO:
        return None
    shortened = Shortened()
    for index in kept:
        if index in cuts:
            shortened.lines += 1
            shortened.sentences += cuts[index][0]
            shortened.characters += cuts[index][1]
    return Compressed(body, _phrase(len(lines), len(kept), shortened))


@dataclass(slots=True)
class Parts:
    """Each line's part in the document, and where the parts that need a closer look are."""

    kinds: list[str]
    headings: list[tuple[int, int]]  # (line, level)
    items: list[int]
    fences: list[tuple[int, int]]  # (opening line, closing line) of each code block
    flat: list[int]  # lines scored by their kind alone
    key: list[int]  # text lines of a summary, conclusion, cause or fix section


def _parts(lines: Sequence[str]) -> Parts:
    """Kinds: heading, underline (of a setext heading), fence, fence-end, code, first-code,
    item, table-head, table, lead (a section's first line), first (a paragraph's first line),
    text, blank."""
    parts = Parts([], [], [], [], [], [])
    kinds = parts.kinds
    add_kind, add_flat, add_key = kinds.append, parts.flat.append, parts.key.append
    opening = -1
    previous = written = "blank"  # the kinds of the line before and of the last non-blank one
    key_section = False
    for index, stripped in enumerate(map(str.strip, lines)):
        first = stripped[:1]
        if not first:
            kind = "code" if opening >= 0 else "blank"
        elif (first in _SPECIAL_STARTS or opening >= 0) and (
            kind := _special(parts, index, stripped, first, previous, opening)
        ):
            if kind == "fence":
                opening = index
            elif kind == "fence-end":
                opening = -1
            elif kind == "heading":
                key_section = _KEY_SECTION.search(stripped) is not None
        elif previous in _PARAGRAPH_BREAKS:
            kind = "lead" if written in ("heading", "underline") else "first"
        else:
            kind = "text"
        if kind in _FLAT:
            add_flat(index)
        elif key_section and kind in _TEXT_KINDS:
            add_key(index)
        add_kind(kind)
        previous = kind
        if kind != "blank":
            written = kind
    return parts


def _special(
    parts: Parts, index: int, stripped: str, first: str, previous: str, opening: int
) -> str:
    """The kind of a non-blank line that is code or starts like markup; '' when it is
    plain text after all."""
    if first in ("`", "~") and stripped.startswith(("```", "~~~")):
        if opening < 0:
            return "fence"
        parts.fences.append((opening, index))
        return "fence-end"
    if opening >= 0:
        return "first-code" if previous == "fence" else "code"
    if first == "#" and _HEADING.match(stripped):
        parts.headings.append((index, len(stripped) - len(stripped.lstrip("#"))))
        return "heading"
    if first in ("=", "-") and previous in ("first", "text") and _UNDERLINE.fullmatch(stripped):
        parts.kinds[-1] = "heading"  # a setext heading: its text, then === or ---
        parts.headings.append((index - 1, 1 if first == "=" else 2))
        return "underline"
    if first == "|":
        return "table" if previous in ("table", "table-head") else "table-head"
    if first in _ITEM_STARTS and _ITEM.match(stripped):
        parts.items.append(index)
        return "item"
    return ""  # plain text after all


_ITEM_STARTS = frozenset("-*+•0123456789")
_SPECIAL_STARTS = _ITEM_STARTS | frozenset("`~#=|")
_TEXT_KINDS = frozenset({"lead", "first", "item", "text"})
_PARAGRAPH_BREAKS = frozenset({"blank", "heading", "underline", "fence-end", "table"})
_KIND_SCORE = {
    "heading": 0.0,  # by level, below
    "underline": 0.0,
    "fence": FENCE,
    "fence-end": FENCE,
    "first-code": FIRST_CODE_LINE,
    "code": OTHER,
    "item": PLAIN_ITEM,
    "table-head": TABLE_HEAD,
    "table": OTHER,
    "first": FIRST_LINE,
    "lead": LEAD_LINE,
    "text": OTHER,
    "blank": 0.0,
}
_FLAT = frozenset({"underline", "fence", "fence-end", "table-head", "blank"})


def _scores(shown: Sequence[str], parts: Parts, facts: LineFacts) -> list[float]:
    """Each line's part in the document plus how dense it is in identifiers and errors."""
    density = score_lines(shown, facts.features, list(facts.errors), list(facts.focus.items()))
    scores = list(map(add, map(_KIND_SCORE.__getitem__, parts.kinds), density))
    for index, level in parts.headings:
        scores[index] = HEADING - HEADING_STEP * level
    for index in parts.items:
        item = _ITEM.sub("", shown[index].lstrip(), count=1)
        if _has_signal(item):
            scores[index] += SIGNAL_ITEM - PLAIN_ITEM
    for index in parts.key:
        scores[index] += KEY_SECTION_BONUS
    for index in parts.flat:
        scores[index] = _KIND_SCORE[parts.kinds[index]]
    return scores


def _has_signal(line: str) -> bool:
    return (
        any(mark in line for mark in SIGNAL_CHARS)
        or DIGIT.search(line) is not None
        or SIGNAL_WORDS.search(line) is not None
    )


def _shorten(line: str, cap: int, code: bool = False) -> tuple[str, int, int]:
    """A line longer than ``cap``: its first sentence and the sentences that carry signals,
    in order, with a gap for each run of left-out sentences; code, a line without sentences
    or a huge one keeps its start and end. Returns (line, sentences cut, characters cut)."""
    if len(line) <= cap:
        return line, 0, 0
    sentences = [] if code or len(line) > MAX_PARAGRAPH else SENTENCE_END.split(line)
    if len(sentences) < 3:
        clipped, characters = clip_line(line, cap)
        return clipped, 0, characters
    keep = [0]
    spent = len(sentences[0])
    for index in range(1, len(sentences)):
        sentence = sentences[index]
        if _has_signal(sentence) and spent + len(sentence) + 1 <= cap:
            keep.append(index)
            spent += len(sentence) + 1
    if len(keep) == len(sentences):
        return line, 0, 0
    parts: list[str] = []
    previous = -1
    for index in [*keep, len(sentences)]:
        if index > previous + 1:
            parts.append(gap_line(index - previous - 1, "sentences"))
        if index < len(sentences):
            parts.append(sentences[index])
        previous = index
    return " ".join(parts), len(sentences) - len(keep), 0


def _demote_empty_sections(parts: Parts, scores: list[float], kept: list[int]) -> None:
    """Give a deep heading (level 3 and below) whose section kept nothing the score of a
    plain line, so the budget goes to content rather than to an outline of empty sections."""
    chosen = set(kept)
    starts = [index for index, _ in parts.headings] + [len(parts.kinds)]
    for (index, level), end in zip(parts.headings, starts[1:], strict=True):
        if level >= 3 and index in chosen and not chosen.intersection(range(index + 1, end)):
            scores[index] = OTHER


def _with_headings(parts: Parts, kept: list[int]) -> list[int]:
    """Kept lines plus the heading of every section that keeps something, and its parents:
    no content is shown without the outline that says where it is."""
    headings = parts.headings
    ends = [len(parts.kinds)] * len(headings)  # where each section, subsections included, ends
    open_sections: list[int] = []
    for position, (index, level) in enumerate(headings):
        while open_sections and headings[open_sections[-1]][1] >= level:
            ends[open_sections.pop()] = index
        open_sections.append(position)
    ordered = sorted(kept)
    chosen = set(kept)
    for (index, _), end in zip(headings, ends, strict=True):
        after = bisect_right(ordered, index)
        if after < len(ordered) and ordered[after] < end:
            chosen.add(index)
            if index + 1 < len(parts.kinds) and parts.kinds[index + 1] == "underline":
                chosen.add(index + 1)
    return sorted(chosen)


def _whole_fences(parts: Parts, kept: list[int]) -> list[int]:
    """Fence lines only around a code block that keeps some code: the opening fence (with its
    language) and the closing one then both stay."""
    chosen = set(kept)
    for opening, closing in parts.fences:
        if any(index in chosen for index in range(opening + 1, closing)):
            chosen.update((opening, closing))
        else:
            chosen.difference_update((opening, closing))
    return sorted(chosen)


def _with_blank_separators(lines: Sequence[str], kept: list[int]) -> list[int]:
    """Kept lines plus the blank lines right after them, which cost one character and keep
    paragraphs apart."""
    chosen = set(kept)
    for index in kept:
        if index + 1 < len(lines) and not lines[index + 1].strip():
            chosen.add(index + 1)
    return sorted(chosen)


def _phrase(total: int, shown: int, shortened: Shortened) -> str:
    parts: list[str] = []
    if total > shown:
        parts.append(f"{total - shown} of {total} lines omitted")
    inside: list[str] = []
    if shortened.sentences:
        inside.append(_plural(shortened.sentences, "sentence"))
    if shortened.characters:
        inside.append(_plural(shortened.characters, "character"))
    if inside:
        where = _plural(shortened.lines, "long line")
        cut = " and ".join(inside)
        parts.append(f"and {cut} from {where}" if parts else f"{cut} omitted from {where}")
    return ", ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
