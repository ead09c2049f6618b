"""The fallback compressor for any large output no other compressor claimed.

It keeps the head and the tail, then the lines that carry errors, paths, ``file:line``
references, identifiers and numbers, densest first, until the budget is spent. Runs of
identical lines fold to one line and a count; a line longer than its share of the budget keeps
its start and end with the exact number of characters cut between them.

The analysis runs on the UTF-8 bytes at C speed (``translate``, ``split``, ``find``): about
3 ms for a 100 KB output of ordinary lines. ``LineFacts``, ``analyse_lines``, ``choose``,
``clip_line`` and ``render_kept`` are shared with the prose compressor.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, islice, repeat
from itertools import compress as where
from operator import add, eq, mul, ne

from compressors.markers import GAP_COST, gap_line, utf8
from compressors.outputs import Budget, Compressed, ToolOutput

MIN_CHARS = 400  # below this nothing is worth a marker
MAX_RATIO = 0.8  # a result is kept only when it saves at least 20%
HEAD_SHARE = 0.15  # of the budget, for the first lines
TAIL_SHARE = 0.25  # of the budget, for the last lines: summaries and exit codes live there
MIN_LINE_CAP = 400  # a long line among others keeps at least this much
MIN_RUN = 3  # identical consecutive lines fold from this many on
NAMES_SHARE = 0.25  # of the budget, for the names gap lines give of what their lines mention
MENTION_COST = len("; they mention: ")
NAME_SCAN_CHARS = 16_000  # of the best left-out lines, searched for names

ERROR_WORDS = tuple(
    word.encode()
    for word in (
        "error", "warn", "exception", "fail", "fatal", "traceback", "panic", "denied",
        "cannot", "not found", "no such", "invalid", "abort", "timed out", "assert", "conflict",
    )
)  # fmt: skip
# An error word right after one of these is part of a name (exceptions.py, test_fail, on-error)
NAME_JOINERS = frozenset(b"/\\_.-")
ERROR_WEIGHT = 16
# Paths, file:line references, snake_case, dotted names and key=value pairs are made of these
FEATURE_BYTES = b"/_.:=\n"
DIGIT_BYTES = b"0123456789\n"
MAX_FEATURES = 24  # identifier characters count twice
FILLER_SCORE = 0.1  # plain lines fill whatever budget the scored lines leave
# A line naming words of the session's task (``ToolOutput.focus``) is likelier to matter
FOCUS_WEIGHT = 8
MAX_FOCUS_PER_LINE = 3
MAX_FOCUS_TERMS = 32  # task terms searched for, of those the output contains at all
_NOT_FEATURE = bytes(byte for byte in range(256) if byte not in FEATURE_BYTES)
# A compound name: a relative module, dotted, a path or file:line, snake_case, camelCase or
# CamelCase (possessive quantifiers: no backtracking inside a word)
_NAME = re.compile(
    r"(?:\.\.?+/)++[\w$@~-][\w.$@~-]*+(?:/[\w.$@~-]++)*+"  # a relative module: ./util, ../lib
    r"|[A-Za-z_$][\w$]*+(?:[./:-][\w$]++)++"
    r"|_*+[A-Za-z$][A-Za-z0-9$]*+_[\w$]*+"
    r"|[a-z][a-z0-9]*+[A-Z][\w$]*+"
    r"|[A-Z][a-z0-9]++[A-Z][\w$]*+"
    r"|[A-Z]{2,}+[a-z][\w$]*+"  # HTTPStatusCode, IOError
)
_HYPHENATED_WORD = re.compile(r"[A-Za-z][a-z]*-[a-z]+")  # built-in, in-memory: English
_NOT_DIGIT = bytes(byte for byte in range(256) if byte not in DIGIT_BYTES)
# lowercase letters, digits and non-ASCII bytes stay; everything else becomes a space
_WORD_BYTES = bytes(
    byte if 48 <= byte <= 57 or 97 <= byte <= 122 or byte >= 128 else 32 for byte in range(256)
)


def recognises(output: ToolOutput, budget: Budget) -> bool:
    return len(output.text) >= MIN_CHARS and len(output.text) > budget.max_chars


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    if not recognises(output, budget):
        return None
    text = output.text
    lines = text.split("\n")
    if len(lines) == 1:
        return _compress_single_line(text, budget.max_chars)
    return _compress_lines(text, lines, budget.max_chars, output.focus)


def _compress_single_line(text: str, max_chars: int) -> Compressed | None:
    clipped, cut = clip_line(text, max_chars)
    if len(clipped) > len(text) * MAX_RATIO:
        return None
    return Compressed(clipped, f"{cut} of {len(text)} characters omitted")


def _compress_lines(
    text: str, lines: list[str], max_chars: int, focus: frozenset[str]
) -> Compressed | None:
    facts = analyse_lines(text, lines, ERROR_WORDS, focus)
    units = fold_runs(lines)
    cap = max(MIN_LINE_CAP, max_chars // min(len(units.texts), 4))
    shown, cuts = show_units(units, cap)
    features = list(map(facts.features.__getitem__, units.firsts))
    unit_of = dict(zip(units.firsts, range(len(units.firsts)), strict=True))
    errors = [unit_of[line] for line in facts.errors if line in unit_of]
    focus_hits = [(unit_of[line], hits) for line, hits in facts.focus.items() if line in unit_of]
    scores = score_lines(shown, features, errors, focus_hits)
    for index in units.repeats:
        scores[index] = 0.0
    kept, names = choose_with_names(shown, scores, max_chars)
    body = render_kept(shown, kept, units.counts, names_by_gap(kept, names))
    if len(body) > len(text) * MAX_RATIO:
        return None
    cut_lines = [cuts[index] for index in kept if cuts[index]]
    return Compressed(body, omitted_lines_phrase(len(lines), len(kept), cut_lines))


@dataclass(frozen=True, slots=True)
class LineFacts:
    features: list[int]  # per original line: identifier characters twice, up to 4 digits
    errors: set[int]  # original lines that mention an error word
    focus: dict[int, int]  # original lines that name task terms: how many distinct ones


def analyse_lines(
    text: str,
    lines: Sequence[str],
    words: Sequence[bytes] = ERROR_WORDS,
    focus: frozenset[str] = frozenset(),
) -> LineFacts:
    """Identifier density of each line, which lines mention one of ``words`` (lowercase
    error words; each costs one pass over the text) and which name terms of the task."""
    data = utf8(text)  # UTF-8 never has a newline byte inside a character: lines align
    # runs of dots are ellipses, leaders and progress, not names
    punctuation = map(len, data.replace(b"..", b"").translate(None, _NOT_FEATURE).split(b"\n"))
    digits = map(len, data.translate(None, _NOT_DIGIT).split(b"\n"))
    # a number or two tell; more digits are mostly line numbers, ranges and timestamps
    features = list(map(add, map(mul, punctuation, repeat(2)), map(min, digits, repeat(4))))
    lengths = map(add, map(len, data.split(b"\n")), repeat(1))
    starts = list(accumulate(lengths, initial=0))
    lowered = data.lower()
    errors = _error_lines(lowered, starts, len(lines), words)
    return LineFacts(features, errors, focus_hits_at(lowered, starts, len(lines), focus))


def _error_lines(lowered: bytes, starts: list[int], count: int, words: Sequence[bytes]) -> set[int]:
    found: set[int] = set()
    for word in words:
        position = lowered.find(word)
        while position != -1:
            index = min(bisect_right(starts, position), count) - 1
            if position == 0 or lowered[position - 1] not in NAME_JOINERS:
                found.add(index)
                position = lowered.find(word, starts[index + 1])
            else:
                position = lowered.find(word, position + 1)
    return found


def focus_hits_at(
    lowered: bytes, starts: Sequence[int], count: int, terms: frozenset[str]
) -> dict[int, int]:
    """For the lines (delimited by ``starts``) of ``lowered`` that contain whole words equal
    to task terms, how many distinct terms each contains. One C-speed pass finds which terms
    occur at all; each of at most ``MAX_FOCUS_TERMS`` of those then costs one more pass."""
    if not terms:
        return {}
    words = b" " + lowered.translate(_WORD_BYTES) + b" "  # snake_case splits into its parts
    wanted = {term.encode("utf-8", "surrogatepass") for term in terms}
    present = sorted(wanted.intersection(words.split()))[:MAX_FOCUS_TERMS]
    hits: dict[int, int] = {}
    for term in present:
        needle = b" " + term + b" "
        position = words.find(needle)  # the term starts at ``position`` of ``lowered``
        while position != -1:
            index = min(bisect_right(starts, position), count) - 1
            hits[index] = hits.get(index, 0) + 1
            position = words.find(needle, max(starts[index + 1], position + 1))
    return hits


def score_lines(
    lines: Sequence[str],
    features: Sequence[int],
    errors: Sequence[int],
    focus: Sequence[tuple[int, int]] = (),
) -> list[float]:
    """How much an agent is likely to need each line, per character it costs (at C speed).

    ``features`` counts identifier characters twice and a few digits; ``errors`` are the
    indices of lines that mention an error word; ``focus`` pairs a line's index with how many
    task terms it names.
    """
    weights = [feature if feature < MAX_FEATURES else MAX_FEATURES for feature in features]
    for index in errors:
        weights[index] += ERROR_WEIGHT
    for index, terms in focus:
        weights[index] += FOCUS_WEIGHT * min(terms, MAX_FOCUS_PER_LINE)
    return [
        (weight or (FILLER_SCORE if length else 0.0)) / (1.0 + length / 80.0)
        for weight, length in zip(weights, map(len, lines), strict=True)
    ]


@dataclass(frozen=True, slots=True)
class Units:
    """Lines with each run of identical lines folded into one unit."""

    texts: list[str]
    counts: list[int]
    firsts: list[int]  # index of each unit's first line in the original
    repeats: list[int]  # units whose text already appeared earlier


def fold_runs(lines: list[str]) -> Units:
    same = list(where(range(1, len(lines)), map(eq, islice(lines, 1, None), lines)))
    if same:
        texts, counts, firsts = _fold(lines, same)
    else:  # the common case, decided at C speed
        texts, counts, firsts = lines, [1] * len(lines), list(range(len(lines)))
    first_seen = dict(zip(reversed(texts), range(len(texts) - 1, -1, -1), strict=True))
    later = map(ne, map(first_seen.__getitem__, texts), range(len(texts)))
    repeats = [i for i in where(range(len(texts)), later) if texts[i] and not texts[i].isspace()]
    return Units(texts, counts, firsts, repeats)


def _fold(lines: list[str], same: list[int]) -> tuple[list[str], list[int], list[int]]:
    """Fold runs given ``same``, the indices of lines equal to the line before them."""
    runs: list[tuple[int, int]] = []  # (first, end) of each run long enough to fold
    start = previous = same[0]
    for index in [*same[1:], -1]:
        if index != previous + 1:
            first, end = start - 1, previous + 1
            if end - first >= MIN_RUN and lines[first].strip():
                runs.append((first, end))
            start = index
        previous = index
    texts: list[str] = []
    counts: list[int] = []
    firsts: list[int] = []
    position = 0
    for first, end in [*runs, (len(lines), len(lines))]:
        texts.extend(lines[position:first])
        counts.extend(repeat(1, first - position))
        firsts.extend(range(position, first))
        if first < len(lines):
            texts.append(lines[first])
            counts.append(end - first)
            firsts.append(first)
        position = end
    return texts, counts, firsts


def show_units(units: Units, cap: int) -> tuple[list[str], list[int]]:
    """Each unit as shown: long lines clipped, folded runs followed by their count."""
    texts = units.texts
    if max(map(len, texts)) <= cap and max(units.counts) == 1:
        return texts, [0] * len(texts)
    shown: list[str] = []
    cuts: list[int] = []
    for text, count in zip(texts, units.counts, strict=True):
        clipped, cut = clip_line(text, cap)
        if count > 1:
            clipped = f"{clipped}\n{gap_line(count - 1, 'identical lines')}"
        shown.append(clipped)
        cuts.append(cut)
    return shown, cuts


def clip_line(line: str, cap: int) -> tuple[str, int]:
    """The line, or its start and end with the exact count of characters cut between."""
    if len(line) <= cap:
        return line, 0
    keep = max(cap - len(gap_line(len(line), "characters")), 40)
    head = keep * 2 // 3
    tail = keep - head
    cut = len(line) - head - tail
    if cut <= len(gap_line(cut, "characters")):  # the gap line would not be shorter
        return line, 0
    return f"{line[:head]}{gap_line(cut, 'characters')}{line[-tail:]}", cut


def choose(
    lines: Sequence[str],
    scores: Sequence[float],
    max_chars: int,
    shares: tuple[float, float] = (HEAD_SHARE, TAIL_SHARE),
    ranked: Sequence[int] | None = None,
) -> list[int]:
    """Indices of the lines to keep, ascending: the head and tail ``shares`` of the budget
    first, then lines by descending score (ties: earlier first) while they fit.

    What a line costs counts the gap lines exactly: keeping a line inside a run of left-out
    lines splits that run's gap line in two, keeping the last line of a run removes its gap.
    """
    count = len(lines)
    costs = list(map(add, map(len, lines), repeat(1)))
    kept = bytearray(count + 2)  # kept[i + 1] says whether line i is kept; the ends count as kept
    kept[0] = kept[-1] = 1
    spent = GAP_COST  # at first one gap line stands for everything
    head = _fitting(costs, max_chars * shares[0])
    tail = _fitting(costs[::-1], max_chars * shares[1])
    ends = [*range(head), *range(max(count - tail, head), count)]
    for position, index in enumerate(chain(ends, rank(scores) if ranked is None else ranked)):
        if kept[index + 1]:
            continue
        if position >= len(ends) and scores[index] <= 0.0:
            break
        left, right = kept[index], kept[index + 2]
        cost = costs[index] + (-GAP_COST if left and right else 0 if left or right else GAP_COST)
        if spent + cost <= max_chars:
            kept[index + 1] = 1
            spent += cost
        elif max_chars - spent < GAP_COST:
            break
    return _fill_small_gaps(lines, list(where(range(count), kept[1:-1])))


def _fitting(costs: Sequence[int], allowance: float) -> int:
    """How many leading lines fit the allowance; at least one."""
    spent = 0
    for count, cost in enumerate(costs):
        spent += cost
        if spent > allowance:
            return max(count, 1)
    return len(costs)


def _fill_small_gaps(lines: Sequence[str], kept: list[int]) -> list[int]:
    """Add a left-out line where showing it costs no more than the gap line it replaces."""
    filled: list[int] = []
    previous = -1
    for index in kept:
        if index == previous + 2 and len(lines[index - 1]) <= GAP_COST:
            filled.append(index - 1)
        filled.append(index)
        previous = index
    return filled


def choose_with_names(
    lines: Sequence[str],
    scores: Sequence[float],
    max_chars: int,
    shares: tuple[float, float] = (HEAD_SHARE, TAIL_SHARE),
) -> tuple[list[int], list[tuple[int, str]]]:
    """Lines to keep, and names of left-out lines for the gaps to give (see ``gap_names``):
    ``NAMES_SHARE`` of the budget is set aside for names; what they leave goes to lines."""
    ranked = rank(scores)
    room = int(max_chars * NAMES_SHARE)
    kept = choose(lines, scores, max_chars - room, shares, ranked)
    found = gap_names(lines, kept, scores, room, ranked)
    gaps = {bisect_right(kept, index) for index, _ in found}
    spent = sum(len(name) + 2 for _, name in found) + MENTION_COST * len(gaps)
    if room - spent > GAP_COST:
        kept = choose(lines, scores, max_chars - spent, shares, ranked)
    return kept, found


def rank(scores: Sequence[float]) -> list[int]:
    """Line indices by descending score; ties keep their order."""
    return sorted(range(len(scores)), key=scores.__getitem__, reverse=True)


def gap_names(
    lines: Sequence[str],
    kept: Sequence[int],
    scores: Sequence[float],
    room: int,
    ranked: Sequence[int],
) -> list[tuple[int, str]]:
    """Compound identifiers (dotted, snake_case, paths, file:line) of left-out lines that no
    kept line shows, longest first, as far as ``room`` characters allow: (line, name) pairs.
    Only the best-scoring left-out lines, ``NAME_SCAN_CHARS`` of them, are searched, and only
    lines with a dot, underscore, slash or colon (camelCase alone is not worth a regex)."""
    if room <= 0:
        return []
    visible = set(_NAME.findall("\n".join([lines[i] for i in kept if _may_name(lines[i])])))
    chosen = set(kept)
    scanned = 0
    candidates: list[tuple[float, int, str]] = []  # (-weight, line, name)
    for index in ranked:
        if scanned > NAME_SCAN_CHARS or scores[index] <= 0.0:
            break
        line = lines[index]
        if index in chosen or not _may_name(line):
            continue
        scanned += len(line)
        candidates.extend(
            (-_name_weight(name), index, name)
            for name in set(_NAME.findall(line)).difference(visible)
            if not _HYPHENATED_WORD.fullmatch(name)
        )
    named: list[tuple[int, str]] = []
    gaps: set[int] = set()
    spent = 0
    for _, index, name in sorted(candidates):
        gap = bisect_right(kept, index)
        cost = len(name) + 2 + (0 if gap in gaps else MENTION_COST)
        if name not in visible and spent + cost <= room:
            visible.add(name)
            gaps.add(gap)
            spent += cost
            named.append((index, name))
    return named


def _name_weight(name: str) -> float:
    """Longer names are more specific, up to a point; ids and hashes (many digits, no
    separators) are seldom what an agent cites."""
    length = min(len(name), 32)
    digits = sum(map(str.isdigit, name))
    if digits >= 4 and not _may_name(name):
        return length / 4
    return length


def _may_name(line: str) -> bool:
    return "." in line or "_" in line or "/" in line or ":" in line


def names_by_gap(kept: Sequence[int], found: Sequence[tuple[int, str]]) -> dict[int, list[str]]:
    """Names of left-out lines, in line order, keyed by their gap: the number of kept lines
    before it. Names of lines that are kept after all are dropped: they are visible."""
    chosen = set(kept)
    named: dict[int, list[str]] = {}
    for index, name in sorted(found):
        if index not in chosen:
            named.setdefault(bisect_right(kept, index), []).append(name)
    return named


def render_kept(
    lines: Sequence[str],
    kept: Sequence[int],
    counts: Sequence[int] | None = None,
    names: dict[int, list[str]] | None = None,
) -> str:
    """Kept lines in order, with one gap line per run of left-out original lines;
    ``counts`` says how many original lines each entry of ``lines`` stands for, ``names``
    what each gap (keyed by the number of kept lines before it) should name."""
    before = list(accumulate(counts, initial=0)) if counts else range(len(lines) + 1)
    names = names or {}
    out: list[str] = []
    previous = -1
    for position, index in enumerate([*kept, len(lines)]):
        if index > previous + 1:
            count = before[index] - before[previous + 1]
            out.append(gap_line(count, "lines", names.get(position, ())))
        if index < len(lines):
            out.append(lines[index])
        previous = index
    return "\n".join(out)


def omitted_lines_phrase(total: int, shown: int, cuts: Sequence[int]) -> str:
    parts: list[str] = []
    if total > shown:
        parts.append(f"{total - shown} of {total} lines omitted")
    if cuts:
        chars = sum(cuts)
        location = "1 long line" if len(cuts) == 1 else f"{len(cuts)} long lines"
        if parts:
            parts.append(f"and {chars} characters from {location}")
        else:
            parts.append(f"{chars} characters omitted from {location}")
    return ", ".join(parts)
