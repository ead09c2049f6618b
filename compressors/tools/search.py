"""Search results: grep / ripgrep / ag output, OpenCode and Claude Code grep tools, SWE-agent
``search_dir`` and ``search_file``.

Matches are grouped by file. Every file first gets its first match kept, then its second, and
so on (files holding source code and more matches first) until the budget is spent. Kept
lines stay verbatim, so each keeps its ``path:line`` prefix (or sits under its file's group
header), and each run of left-out lines becomes one gap line with exact counts.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from compressors.markers import GAP_COST, gap_line
from compressors.outputs import Budget, CallArguments, Compressed, ToolOutput

SEARCH_TOOLS = frozenset(
    {"grep", "search", "search_dir", "search_file", "rg", "ripgrep", "grep_search",
     "codebase_search", "code_search"}
)  # fmt: skip
_SEARCH_COMMAND = re.compile(
    r"(?:^|[\s|;&(/])(?:grep|egrep|fgrep|rg|ag|ack|search_dir|search_file)(?:\s|$)"
    r"|\bgit\s+grep\b"
)

HANDFUL = 10  # this many matches or fewer pass unchanged
FIRST_FEW = 3  # a file's first matches are kept in order; its others by identifiers they carry
PREFIX_SCAN = 400  # a match line's path:line: prefix is looked for in this many chars
LONG_LINE = 320  # kept match lines are clipped to about this many chars
SHAPE_SAMPLE = 40  # lines sampled to decide whether the output is a search result at all
NOTES = 12  # lines that are neither matches nor headers kept as they are; more: head and tail

# Line kinds. SEP (blank line, grep's "--") and GROUP (a file header) are structure: they are
# shown with the lines they separate or head, and never counted as omitted.
MATCH, CONTEXT, GROUP, SEP, NOTE = range(5)

# path:12:text (match) and path-12-text (context, grep -C); optional Windows drive letter.
# The match form is tried first and alone: without the lazy path it is twice as fast.
_MATCH_LINE = re.compile(r"((?:[A-Za-z]:)?[^\s:]+):(\d+):")
_NUMBERED = re.compile(r"(?P<path>(?:[A-Za-z]:)?[^\s:]+?)(?P<sep>[:-])(?P<num>\d+)(?P=sep)")
_NUM_ONLY = re.compile(r"(?P<num>\d+)(?P<sep>[:-])")  # single-file grep -n, rg --heading
_PATH_TEXT = re.compile(r"(?P<path>(?:[A-Za-z]:)?[^\s:]+):(?:[^:]|$)")  # grep -r without -n
_OPENCODE_LINE = re.compile(r"\s+Line (?P<num>\d+): ")
_SWE_LINE = re.compile(r"Line (?P<num>\d+):")
_SWE_DIR_FILE = re.compile(r"(?P<path>\S.*?) \((?P<num>\d+) match(?:es)?\)$")
_SWE_HEADER = re.compile(r'Found \d+ match(?:es)? for ".*" in (?P<path>.+?):?$')
_LOOKS_LIKE_PATH = re.compile(r"[\w.~-]*[/\\]\S*|[\w-]+\.[A-Za-z]\w{0,7}")

SOURCE_EXTENSIONS = frozenset(
    {"py", "pyi", "js", "jsx", "ts", "tsx", "mjs", "cjs", "go", "rs", "java", "kt", "kts",
     "scala", "c", "h", "cc", "cpp", "cxx", "hpp", "hh", "cs", "rb", "php", "swift", "m",
     "mm", "sh", "bash", "zsh", "lua", "pl", "pm", "r", "jl", "ex", "exs", "erl", "hs", "ml",
     "clj", "dart", "vue", "svelte", "sql", "proto", "zig", "nim", "fs", "groovy", "pyx"}
)  # fmt: skip
_JUNK = re.compile(
    r"node_modules/|site-packages/|dist-packages/|/dist/|/build/|vendor/|\.git/|__pycache__"
    r"|\.min\.|\.map$|-lock\.|\.lock$"
)


@dataclass(slots=True)
class _File:
    path: str
    order: int
    entries: list[int] = field(default_factory=list)  # its MATCH and CONTEXT lines
    header: int = -1
    matches: int = 0


@dataclass(slots=True)
class _Parsed:
    """Per line: its kind, its file ('' when none) and how many matches it stands for."""

    lines: list[str]
    kinds: list[int] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    weights: list[int] = field(default_factory=list)
    groups: dict[str, _File] = field(default_factory=dict)
    dir_listing: bool = False  # SWE-agent search_dir: one "path (N matches)" line per file


def recognises(output: ToolOutput, budget: Budget) -> bool:
    return _search_lines(output, budget) is not None


def _search_lines(output: ToolOutput, budget: Budget) -> tuple[list[str], bool] | None:
    """The output's lines and whether its call was a search, when it looks like one."""
    text = output.text
    if len(text) <= budget.max_chars or "\x00" in text[:4096]:
        return None
    lines = text.split("\n")
    if not lines[-1]:
        lines.pop()
    in_context = is_search_context(output)
    return (lines, in_context) if looks_like_search(lines, in_context) else None


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    found = _search_lines(output, budget)
    if found is None:
        return None
    text = output.text
    lines, in_context = found
    parsed = _parse(lines, in_context)
    matches = sum(w for k, w in zip(parsed.kinds, parsed.weights, strict=True) if k == MATCH)
    if matches <= HANDFUL:
        return None
    kept = _select(parsed, budget.max_chars)
    body = _render(parsed, kept, _pattern(output))
    if len(body) > 0.8 * len(text):
        return None
    return Compressed(body, _omitted(parsed, kept))


def is_search_context(output: ToolOutput) -> bool:
    """Whether the call was a search: a search tool, or a shell command running grep & co."""
    if output.tool_key in SEARCH_TOOLS:
        return True
    command = CallArguments(output.arguments).text("command", "cmd", "script", "input")
    return bool(command) and _SEARCH_COMMAND.search(command[:2000]) is not None


def looks_like_search(lines: Sequence[str], in_context: bool) -> bool:
    """Cheap check on a sample of lines: are most of them search matches? Without a search
    call to vouch for it, only ``path:line:`` lines count, and they must be most lines."""
    sample = [line for line in lines[: SHAPE_SAMPLE * 2] if line.strip()][:SHAPE_SAMPLE]
    if len(sample) < 3:
        return False
    if _SWE_HEADER.match(sample[0]):
        return True
    hits = sum(1 for line in sample if _is_match_shaped(line, in_context))
    return hits >= (0.5 if in_context else 0.7) * len(sample)


def _is_match_shaped(line: str, in_context: bool) -> bool:
    if line == "--" or _OPENCODE_LINE.match(line):
        return True
    stripped = line.rstrip()
    if stripped.endswith(":") and _looks_like_path(stripped[:-1]):
        return True  # OpenCode's group header
    found = _NUMBERED.match(line, 0, PREFIX_SCAN)
    if found is not None:
        return _looks_like_path(found["path"])
    if not in_context:
        return False
    if _NUM_ONLY.match(line) or _SWE_LINE.match(line):
        return True
    found = _PATH_TEXT.match(line, 0, PREFIX_SCAN)
    return found is not None and _looks_like_path(found["path"])


def _looks_like_path(candidate: str) -> bool:
    return (
        len(candidate) < PREFIX_SCAN
        and not candidate.startswith(("http", "ftp", "git@"))
        and _LOOKS_LIKE_PATH.fullmatch(candidate) is not None
    )


# --- parsing -------------------------------------------------------------------------------


class _Parser:
    """One pass over the lines; remembers which path-looking strings it has checked."""

    def __init__(self, lines: list[str], in_context: bool) -> None:
        self.lines = lines
        self.in_context = in_context
        self.paths: dict[str, bool] = {}
        self.parsed = _Parsed(lines)
        # The file of the enclosing group header (OpenCode, rg --heading, SWE-agent); '' for
        # the one file a grep searched; None while lines without a path cannot be matches.
        self.current: str | None = "" if in_context else None

    def is_path(self, candidate: str) -> bool:
        known = self.paths.get(candidate)
        if known is None:
            known = self.paths[candidate] = _looks_like_path(candidate)
        return known

    def run(self) -> _Parsed:
        first = next((line for line in self.lines[:5] if line.strip()), "")
        header = _SWE_HEADER.match(first)
        if header is not None:
            self.current = header["path"].strip()
        parsed = self.parsed
        kinds, files, weights = parsed.kinds, parsed.files, parsed.weights
        match_line = _MATCH_LINE.match
        paths = self.paths
        for index, line in enumerate(self.lines):
            # The common case, grep's path:N:text, inline: this loop runs once per line.
            found = match_line(line, 0, PREFIX_SCAN)
            if found is not None and (paths.get(found[1]) or self.is_path(found[1])):
                kinds.append(MATCH)
                files.append(found[1])
                weights.append(1)
                continue
            kind, path, weight = self.classify(line, index)
            if kind == GROUP:
                self.current = path
            kinds.append(kind)
            files.append(path)
            weights.append(weight)
        _attach_context(parsed)
        _group(parsed)
        return parsed

    def classify(self, line: str, index: int) -> tuple[int, str, int]:
        """Any line but grep's path:N:text."""
        if line == "--" or not line.strip():
            return SEP, "", 0
        if "-" in line:
            found = _NUMBERED.match(line, 0, PREFIX_SCAN)
            if found is not None and self.is_path(found["path"]):
                return (MATCH if found["sep"] == ":" else CONTEXT), found["path"], 1
        current = self.current
        if current is not None:
            if line[0].isspace():
                found = _OPENCODE_LINE.match(line)
                if found is not None and current:
                    return MATCH, current, 1
            found = _SWE_LINE.match(line) or (_NUM_ONLY.match(line) if self.in_context else None)
            if found is not None:
                return (CONTEXT if found.groupdict().get("sep") == "-" else MATCH), current, 1
            found = _SWE_DIR_FILE.match(line) if current else None
            if found is not None and self.is_path(found["path"].strip()):
                self.parsed.dir_listing = True
                return MATCH, found["path"], int(found["num"])
        return self.classify_unnumbered(line, index)

    def classify_unnumbered(self, line: str, index: int) -> tuple[int, str, int]:
        stripped = line.strip()
        if stripped.endswith(":") and " " not in stripped and self.is_path(stripped[:-1]):
            return GROUP, stripped[:-1], 0  # OpenCode: "path:" then "  Line N: text"
        if not self.in_context:
            return NOTE, "", 0
        if stripped == line and " " not in line and self.is_path(line):
            following = self.lines[index + 1] if index + 1 < len(self.lines) else ""
            if _NUM_ONLY.match(following):
                return GROUP, line, 0  # rg --heading: "path" then "N:text"
        found = _PATH_TEXT.match(line, 0, PREFIX_SCAN)
        if found is not None and self.is_path(found["path"]):
            return MATCH, found["path"], 1
        return NOTE, "", 0


def _parse(lines: list[str], in_context: bool) -> _Parsed:
    return _Parser(lines, in_context).run()


def _attach_context(parsed: _Parsed) -> None:
    """A context line belongs to the file of its hunk's matches: a path holding ``-N-`` can
    fool the context pattern, so a path no match has is replaced by the neighbouring one."""
    kinds, files = parsed.kinds, parsed.files
    if CONTEXT not in kinds:
        return
    known = {files[i] for i, kind in enumerate(kinds) if kind == MATCH}
    for order in (range(len(kinds)), range(len(kinds) - 1, -1, -1)):
        neighbour = ""
        for index in order:
            kind = kinds[index]
            if kind == MATCH:
                neighbour = files[index]
            elif kind == SEP:
                neighbour = ""
            elif kind == CONTEXT and files[index] not in known and neighbour:
                files[index] = neighbour


def _group(parsed: _Parsed) -> None:
    groups = parsed.groups
    for index, kind in enumerate(parsed.kinds):
        if kind not in (MATCH, CONTEXT, GROUP):
            continue
        path = parsed.files[index]
        group = groups.get(path)
        if group is None:
            group = groups[path] = _File(path, len(groups))
        if kind == GROUP:
            if group.header < 0:
                group.header = index
            continue
        group.entries.append(index)
        if kind == MATCH:
            group.matches += parsed.weights[index]


# --- selection -----------------------------------------------------------------------------


def _file_priority(group: _File) -> tuple[int, int, int]:
    """Source files first, then other files, then vendored and generated ones; within each,
    files with more matches first."""
    path = group.path.replace("\\", "/")
    if _JUNK.search(path):
        kind = 2
    elif path.rsplit(".", 1)[-1].lower() in SOURCE_EXTENSIONS:
        kind = 0
    else:
        kind = 1
    return kind, -group.matches, group.order


def _select(parsed: _Parsed, max_chars: int) -> set[int]:
    """Indices to keep: notes (headers, footers) first, then each file's first match, then
    each file's second, and so on, until the budget is spent."""
    lines, kinds = parsed.lines, parsed.kinds
    notes = [i for i, kind in enumerate(kinds) if kind == NOTE]
    kept: set[int] = set()
    cost = [(len(line) if len(line) < LONG_LINE else LONG_LINE) + 1 + GAP_COST // 2
            for line in lines]  # fmt: skip
    for index in notes if len(notes) <= NOTES else notes[: NOTES // 2] + notes[-NOTES // 2 :]:
        kept.add(index)
    spent = sum(cost[index] for index in kept)
    order = sorted(parsed.groups.values(), key=_file_priority)
    ranks = _ranks(parsed)
    # One sort key: a line's rank in its file, then its file's place in the priority order.
    # Ranks step by halves (a context line ranks just after its match), hence the doubling.
    places = 2 * len(order)
    keyed: list[tuple[float, int, int]] = []
    for place, group in enumerate(order):
        header = group.header
        keyed.extend((ranks[index] * places + place, index, header) for index in group.entries)
    keyed.sort()
    for _, index, header in keyed:
        needed = cost[index] + (cost[header] if header >= 0 and header not in kept else 0)
        if spent + needed <= max_chars:
            kept.add(index)
            if header >= 0:
                kept.add(header)
            spent += needed
        elif spent > max_chars - GAP_COST:
            break
    return kept


def _ranks(parsed: _Parsed) -> list[float]:
    """Per line: 0 for a file's first match, 1 for its second… (after the first few, matches
    rich in identifiers come first); a context line ranks just after the nearest match."""
    ranks = [0.0] * len(parsed.lines)
    kinds, lines = parsed.kinds, parsed.lines
    for group in parsed.groups.values():
        matches = [i for i in group.entries if kinds[i] == MATCH]
        if len(matches) > FIRST_FEW:
            rest = matches[FIRST_FEW:]
            density = [_density(lines[i]) for i in rest]
            by_density = sorted(range(len(rest)), key=density.__getitem__, reverse=True)
            matches = matches[:FIRST_FEW] + [rest[j] for j in by_density]
        for rank, index in enumerate(matches):
            ranks[index] = rank
        if len(matches) < len(group.entries):
            in_order = sorted(matches)
            for index in group.entries:
                if kinds[index] == CONTEXT:
                    ranks[index] = (ranks[_nearest(in_order, index)] if in_order else 0) + 0.5
    return ranks


def _density(line: str) -> int:
    """How many identifiers a line carries, near enough: dotted names, snake_case, calls."""
    return line.count("_") + line.count(".") + line.count("(")


def _nearest(matches: list[int], index: int) -> int:
    """The match line nearest to ``index`` (the earlier one on a tie)."""
    after = bisect.bisect_left(matches, index)
    if after == 0:
        return matches[0]
    if after == len(matches):
        return matches[-1]
    before = matches[after - 1]
    return before if index - before <= matches[after] - index else matches[after]


# --- rendering -----------------------------------------------------------------------------


def _pattern(output: ToolOutput) -> str:
    return CallArguments(output.arguments).text("pattern", "query", "regex", "search_term")


def _clip(line: str, pattern: str) -> str:
    """A very long kept line (minified code, data) shortened around the searched text."""
    if len(line) <= LONG_LINE:
        return line
    found = _NUMBERED.match(line, 0, PREFIX_SCAN)
    prefix_end = found.end() if found is not None else 0
    at = line.find(pattern, prefix_end) if pattern else -1
    start = prefix_end if at < 0 else max(prefix_end, at - LONG_LINE // 3)
    end = min(len(line), start + LONG_LINE - prefix_end)
    parts = [line[:prefix_end]]
    if start > prefix_end:
        parts.append(gap_line(start - prefix_end, "characters") + " ")
    parts.append(line[start:end])
    if end < len(line):
        parts.append(" " + gap_line(len(line) - end, "characters"))
    return "".join(parts)


def _render(parsed: _Parsed, kept: set[int], pattern: str) -> str:
    lines, kinds = parsed.lines, parsed.kinds
    out: list[str] = []
    pending: list[int] = []  # left-out indices since the last shown line
    for index, line in enumerate(lines):
        kind = kinds[index]
        # A separator shows only before a shown line, and grep's "--" never after a gap line.
        shown = index in kept or (
            kind == SEP and bool(out) and index + 1 in kept and not (pending and line == "--")
        )
        if not shown:
            pending.append(index)
            continue
        if pending:
            out.extend(_gap(parsed, pending))
            pending = []
        out.append(_clip(line, pattern) if kind in (MATCH, CONTEXT) else line)
    if pending:
        out.extend(_gap(parsed, pending))
    return "\n".join(out)


def _gap(parsed: _Parsed, omitted: list[int]) -> list[str]:
    """One gap line for a run of left-out lines, counting what they held."""
    kinds, files = parsed.kinds, parsed.files
    counted = [i for i in omitted if kinds[i] not in (SEP, GROUP)]
    if not counted:
        return []
    if parsed.dir_listing and all(kinds[i] == MATCH for i in counted):
        matches = sum(parsed.weights[i] for i in counted)
        return [_gap_line(len(counted), "file", f"{matches} {_plural(matches, 'match')}")]
    noun = "match" if all(kinds[i] == MATCH for i in counted) else "line"
    names = {files[i] for i in counted if kinds[i] in (MATCH, CONTEXT)}
    detail = f"in {len(names)} files" if len(names) > 1 else ""
    return [_gap_line(len(counted), noun, detail)]


def _gap_line(count: int, noun: str, detail: str = "") -> str:
    unit = _plural(count, noun)
    return gap_line(count, f"{unit} ({detail})" if detail else unit)


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return noun
    return noun + "es" if noun.endswith("ch") else noun + "s"


def _omitted(parsed: _Parsed, kept: set[int]) -> str:
    kinds = parsed.kinds
    structure = kinds.count(SEP) + kinds.count(GROUP)
    counted = len(kinds) - structure
    shown = sum(1 for i in kept if kinds[i] not in (SEP, GROUP))
    matches = kinds.count(MATCH)
    shown_matches = sum(1 for i in kept if kinds[i] == MATCH)
    dropped = counted - shown
    if dropped == matches - shown_matches:  # only matches were left out
        unit = "files" if parsed.dir_listing else "matches"
        phrase = f"{dropped} of {matches} {unit} omitted"
    else:
        phrase = f"{dropped} of {counted} lines omitted"
    if parsed.dir_listing:
        return phrase
    hidden = sum(1 for g in parsed.groups.values() if not any(i in kept for i in g.entries))
    if hidden:
        phrase += f", {hidden} of {len(parsed.groups)} files not shown"
    return phrase
