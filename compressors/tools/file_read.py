"""File views: a file's lines as an agent's read tool shows them, usually with line numbers.

Formats recognised (the wrapper lines around the numbered lines are always kept verbatim):

- OpenCode ``read``: ``<path>…</path>``, ``<type>file</type>``, ``<content>``, ``N: line``,
  ``(End of file - total N lines)`` or ``(Showing lines A-B of N. …)``, ``</content>``; the
  older ``<file>`` / ``00001| line`` form too.
- SWE-agent ``open`` / ``goto`` / ``scroll_*``: ``[File: path (N lines total)]``,
  ``(N more lines above)``, ``N:line``, ``(N more lines below)``, ``(Open file: …)``,
  ``(Current directory: …)``, ``bash-$``.
- ``str_replace_editor view`` (SWE-agent, OpenHands) and plain ``cat -n`` / ``nl``:
  ``Here's the result of running `cat -n` on path:`` then ``     N<TAB>line``.
- Claude Code ``Read``: ``     N→line``.
- Un-numbered file text (``cat`` / ``head`` / ``sed -n`` in a shell, or a read tool that does
  not number) only when the call itself says it prints a file; its kept lines are shown with
  gap lines but no invented numbers.

Directory views (``Here's the files and directories up to 2 levels deep …``, OpenCode's
``<type>directory</type>``) are listings, not files: they return None for the listing compressor.

Which lines stay, in this order while the budget lasts: the wrapper; the first lines of the
view (imports, module docstring) and its last lines; structural lines (declarations of
classes, functions, methods and types, top-level assignments and exports, decorators, markdown
headings, section comments, imports further down); then, greedily, the lines that show the most
not-yet-visible identifiers per character, so that names the agent may cite later stay visible.
Every kept line keeps its line-number prefix; each run of left-out lines becomes one gap line.
A kept line longer than a share of the budget is cut, and the cut is shown where it is.
"""

from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from compressors.focus import name_parts
from compressors.markers import GAP_COST, gap_line
from compressors.outputs import Budget, CallArguments, Compressed, ToolOutput
from compressors.vocabulary import SHELL_TOOLS, command_text, shell_program

MIN_FILE_LINES = 8
MIN_SAVING = 0.2  # give up unless at least this share of the characters goes
MAX_TEXT = 4_000_000  # bigger outputs are left to the generic compressor
COVERAGE_LINES = 8000  # views longer than this skip the identifier pass, to stay fast
HEAD_SHARE = 0.15  # of the body budget, for the first lines of a view that starts at line 1
WINDOW_HEAD_LINES = 2  # the first lines kept of a view that starts further down
TAIL_LINES = 3
FOCUS_SHARE = 0.35  # at most this share of the body budget goes to lines about the task
STRUCTURE_SHARE = 0.4  # at most this share of the body budget goes to structural lines
# Measured on the public corpus: the names an agent cites later fit the budget far better as
# a list per gap than as whole lines, so the lines get the rest, but never less than a floor.
INDEX_SHARE = 0.9  # of the budget, for naming what each gap's lines mention …
MIN_BODY_CHARS = 300  # … but this much of it always goes to the lines themselves
MIN_INDEX_WEIGHT = 2.0  # compound names (snake_case, camelCase, dotted) and longer ones
LINE_SHARE = 6  # a kept line is cut to at most max_chars // LINE_SHARE characters …
MIN_LINE_CAP = 240  # … but never below this
PROBE_CHARS = 4096  # only this much of a line is looked at when classifying or scoring it

# A line-number prefix: leading spaces, the number, then the separator that names the style.
_NUMBER_PREFIX = re.compile(r" *(\d{1,9})(\t|→|: ?|\| ?)")
# SWE-agent's abbreviated views: right-aligned numbers and one space ("   159 ... eliding").
_PADDED_NUMBER = re.compile(r" +(\d{1,9})( )")
_DIRECTORY_VIEW = re.compile(
    r"^(?:OBSERVATION:\s*)?Here's the files and directories up to|<type>directory</type>", re.M
)
# Tools whose output is a file's text even without line numbers (editor views always number).
_READ_TOOLS = frozenset({"read", "read_file", "view_file", "open_file", "cat"})
_READ_PROGRAMS = frozenset({"cat", "head", "tail", "sed", "bat", "less", "more", "nl"})

_DECLARATION = re.compile(
    r"(?:export\s+)?(?:default\s+)?(?:pub(?:\([\w:]+\))?\s+)?(?:public\s+|private\s+|protected\s+|"
    r"internal\s+|abstract\s+|final\s+|sealed\s+|static\s+|partial\s+|data\s+)*"
    r"(?:class|struct|interface|trait|impl|enum|union|type|module|namespace|object|protocol|"
    r"extension|record|typedef)\b[\s<]*[\w:<]"
)
_FUNCTION = re.compile(
    r"(?:export\s+)?(?:default\s+)?(?:pub(?:\([\w:]+\))?\s+)?"
    r"(?:(?:public|private|protected|internal|static|final|abstract|override|virtual|async|"
    r"unsafe|extern|inline|const|suspend|open|synchronized)\s+)*"
    r"(?:def|fn|func|function\*?|fun|sub|proc|defn|defp?)\s+[\w$*(.\[]"
)
_METHOD_LIKE = re.compile(
    r"(?:(?:public|private|protected|internal|static|final|abstract|override|virtual|async|"
    r"readonly|get|set)\s+)+[\w<>\[\],.?\s]*?\b[\w$]+\s*(?:<[^>]*>)?\s*\("
)
_ARROW_FUNCTION = re.compile(
    r"(?:export\s+)?(?:const|let|var)\s+[\w$]+\s*(?::[^=]+)?=\s*(?:async\s+)?"
    r"(?:\([^)]*\)|[\w$]+)\s*(?::[^=]+)?=>"
)
_BRACE_SIGNATURE = re.compile(  # C, Java, C#, TS methods: `int main(void) {`, `foo(x): T {`
    r"(?:[\w$<>\[\],*&:~]+\s+)*[\w$~:]+\s*\([^;]*\)\s*(?:const\s*)?(?::\s*[^{;]+)?\{$"
)
_DECORATOR = re.compile(r"@[\w.]+|#\[[\w:]+")
_HEADING = re.compile(r"#{1,6}\s+\S")
_SECTION_COMMENT = re.compile(r"(?:#|//|/\*|--|;+|%)\s*(?:[=*#~-]{3,}|region\b|MARK:|SECTION\b)")
_IMPORT = re.compile(
    r"(?:import\s|from\s+[\w.]+\s+import\b|#include\b|#define\b|using\s+[\w.]+|"
    r"(?:pub\s+)?use\s+[\w:]+|require\s*\(|package\s+[\w.]+|export\s+\*|export\s+\{)"
)
_ASSIGNMENT = re.compile(
    r"(?:export\s+)?(?:(?:const|let|var|static|final|val)\s+)?[A-Za-z_$][\w$.]*"
    r"\s*(?::\s*[^=\n]{1,60})?\s*(?<![=!<>])=(?![=>])"
)
_KEY_LINE = re.compile(r"[\w\"'-][\w.\"' -]*:(?:\s|$)")  # YAML/TOML-ish top-level keys
_LEAD_WORD = re.compile(r"[A-Za-z_$]+")
_MARK_CHARS = frozenset("@#/-;%*[")
_STRUCTURE_WORDS = frozenset(
    ["export", "default", "pub", "public", "private", "protected", "internal", "abstract",
     "final", "sealed", "static", "partial", "data", "class", "struct", "interface", "trait",
     "impl", "enum", "union", "type", "module", "namespace", "object", "protocol", "extension",
     "record", "typedef", "def", "fn", "func", "function", "fun", "sub", "proc", "defn", "defp",
     "async", "override", "virtual", "unsafe", "extern", "inline", "const", "suspend", "open",
     "synchronized", "readonly", "get", "set", "import", "from", "using", "use", "package",
     "require", "let", "var", "val"]
)  # fmt: skip
_CONTROL_WORDS = frozenset(
    ["if", "for", "while", "switch", "catch", "else", "do", "return", "try", "elif", "with"]
)
_IDENTIFIER = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")
# A path with a slash inside, or a relative module (./util, ../../config) as imports name one
_PATH = re.compile(
    r"(?:\.{1,2}/)+[\w$@~-][\w.$@~-]*(?:/[\w.$@~-]+)*|[\w$@~-][\w.$@~-]*(?:/[\w.$@~-]+)+"
)
_COMMON_WORDS = frozenset(
    ["self", "this", "cls", "def", "class", "return", "if", "else", "elif", "for", "while", "in",
     "is", "not", "and", "or", "none", "true", "false", "null", "nil", "import", "from", "as",
     "with", "try", "except", "finally", "raise", "pass", "break", "continue", "lambda", "yield",
     "async", "await", "function", "const", "let", "var", "new", "the", "of", "to", "a", "an",
     "be", "it", "that", "str", "int", "bool", "float", "dict", "list", "tuple", "set", "type",
     "any", "object", "void", "public", "private", "protected", "static", "final", "string",
     "number", "boolean", "undefined", "package", "func", "struct", "impl", "pub", "use", "mut",
     "fn", "match", "case", "default", "switch", "throw", "throws", "catch", "extends",
     "implements", "interface", "enum", "export", "require", "module", "end", "then", "do",
     "args", "kwargs", "value", "get", "put", "err", "error", "ok"]
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class FileView:
    """A file view split into lines; ``is_file_line[i]`` is False for wrapper lines."""

    lines: list[str]
    is_file_line: list[bool]
    content_start: list[int]  # where the file's own text starts in each file line
    starts_at_top: bool  # the view begins with the file's first line
    numbered: bool  # every file line shows its line number
    first_number: int | None = None  # an un-numbered view's first line number, when the call says


def recognises(output: ToolOutput, budget: Budget) -> bool:
    return _view(output, budget) is not None


def _view(output: ToolOutput, budget: Budget) -> FileView | None:
    text = output.text
    if not budget.max_chars < len(text) <= MAX_TEXT or _DIRECTORY_VIEW.search(text, 0, 400):
        return None
    return _parse(text) or (
        _parse_plain(text, _first_line_number(output)) if _prints_a_file(output) else None
    )


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    view = _view(output, budget)
    if view is None:
        return None
    text = output.text
    max_chars = (
        budget.max_chars
        if _confirms_an_edit(output)
        else (budget.file_view_chars or budget.max_chars)
    )
    index_chars = min(int(max_chars * INDEX_SHARE), max(max_chars - MIN_BODY_CHARS, 0))
    contents = [
        line[start : start + PROBE_CHARS]
        for line, start in zip(view.lines, view.content_start, strict=True)
    ]
    tokens = [
        _tokens(content) if flag else set()
        for content, flag in zip(contents, view.is_file_line, strict=True)
    ]
    selection = _choose(view, contents, tokens, max_chars - index_chars, output.focus)
    kept = sorted(selection.kept)
    named = _gap_names(view, kept, index_chars, tokens)
    shown_lines = list(view.lines)
    for index, cut in selection.cut.items():
        shown_lines[index] = cut
    body = _render(view, shown_lines, kept, named)
    if len(body) > len(text) * (1 - MIN_SAVING):
        return None
    return Compressed(body, _omitted(view, kept, selection.cut))


_EDIT_COMMANDS = frozenset({"str_replace", "insert", "create", "undo_edit", "edit", "write"})


def _confirms_an_edit(output: ToolOutput) -> bool:
    """An editor's echo of what it just changed: evidence for one step, not a file to study."""
    return CallArguments(output.arguments).text("command").lower() in _EDIT_COMMANDS


def _gaps(kept: Sequence[int], total: int) -> list[tuple[int, int]]:
    """(first, last) line indices of each run of left-out lines."""
    gaps: list[tuple[int, int]] = []
    previous = -1
    for index in [*kept, total]:
        if index > previous + 1:
            gaps.append((previous + 1, index - 1))
        previous = index
    return gaps


def _gap_names(
    view: FileView, kept: Sequence[int], room: int, tokens: Sequence[set[str]]
) -> dict[int, list[str]]:
    """For each gap (by its number), the identifiers its lines mention that no kept line
    shows (compound names first), as far as ``room`` characters allow."""
    visible: set[str] = set()
    for index in kept:
        visible |= tokens[index]
    first_gap: dict[str, int] = {}  # each hidden name, in the first gap that hides it
    for gap, (first, last) in enumerate(_gaps(kept, len(view.lines))):
        for index in range(first, last + 1):
            for name in tokens[index]:
                if name not in first_gap and name not in visible:
                    first_gap[name] = gap
    ranked = sorted(
        (-weight, gap, name)
        for name, gap in first_gap.items()
        if (weight := _token_weight(name)) >= MIN_INDEX_WEIGHT
    )
    named: dict[int, list[str]] = {}
    chains = ""  # dotted names and paths listed so far: a part of one needs no entry
    spent = 0
    for _, gap, name in ranked:
        if spent + len(name) + 2 > room:
            continue
        if name in chains:
            continue
        if "." in name or "/" in name:
            chains += "\n" + name
        spent += len(name) + 2
        named.setdefault(gap, []).append(name)
    return named


def _render(
    view: FileView, shown: Sequence[str], kept: Sequence[int], named: dict[int, list[str]]
) -> str:
    """The kept lines, each gap saying how many lines it stands for, which (when the view
    knows), and the names ``named`` gives it."""
    numbers = _plain_numbers(view)
    out: list[str] = []
    gap = 0
    previous = -1
    for index in [*kept, len(view.lines)]:
        if index > previous + 1:
            names = sorted(named.get(gap, []))
            span = _span(numbers, previous + 1, index - 1)
            out.append(gap_line(index - previous - 1, "lines", names, span))
            gap += 1
        if index < len(view.lines):
            out.append(shown[index])
        previous = index
    return "\n".join(out)


def _plain_numbers(view: FileView) -> list[int] | None:
    """The file line number of each line of an un-numbered view that knows where it starts
    (0 for header lines), so a gap can say which lines it stands for."""
    if view.numbered or view.first_number is None:
        return None
    numbers: list[int] = []
    number = view.first_number
    for flag in view.is_file_line:
        numbers.append(number if flag else 0)
        number += flag
    return numbers


def _span(numbers: list[int] | None, first: int, last: int) -> str:
    if numbers is None:
        return ""
    shown = [n for n in numbers[first : last + 1] if n]
    if not shown:
        return ""
    return f"file lines {shown[0]}-{shown[-1]}" if len(shown) > 1 else f"file line {shown[0]}"


def _omitted(view: FileView, kept: Sequence[int], cut: dict[int, str]) -> str:
    total = sum(view.is_file_line)
    shown = sum(1 for index in kept if view.is_file_line[index])
    phrase = f"{total - shown} of {total} file lines omitted"
    cut_count = sum(1 for index in kept if index in cut)
    if cut_count:
        phrase += f", the end of {cut_count} long line{'s' if cut_count > 1 else ''} cut"
    if view.numbered:  # deep_expand's start_line/end_line take these numbers (proxy/expand.py)
        phrase += " (start_line/end_line: the line numbers shown)"
    return phrase


# --- recognising a view -----------------------------------------------------------------------


def _parse(text: str) -> FileView | None:
    """A numbered file view, or None when ``text`` is not one."""
    lines = text.split("\n")
    matches = [
        _NUMBER_PREFIX.match(line, 0, 24) or _PADDED_NUMBER.match(line, 0, 24) for line in lines
    ]
    styles: dict[str, int] = {}
    for match in matches:
        if match:
            styles[match.group(2)[0]] = styles.get(match.group(2)[0], 0) + 1
    if not styles:
        return None
    style = max(styles, key=lambda key: styles[key])
    numbered = [m for m in matches if m and m.group(2)[0] == style]
    if len(numbered) < MIN_FILE_LINES:
        return None
    is_file_line = [m is not None and m.group(2)[0] == style for m in matches]
    first = is_file_line.index(True)
    last = len(lines) - 1 - is_file_line[::-1].index(True)
    # Inside the run of file lines nearly every line carries a number…
    if (last - first + 1) - len(numbered) > max(2, len(numbered) // 50):
        return None
    # … and the numbers count up one by one (grep -n output has holes).
    numbers = [int(m.group(1)) for m in numbered]
    steps = sum(1 for a, b in itertools.pairwise(numbers) if b == a + 1)
    if steps < 0.9 * (len(numbers) - 1):
        return None
    # Wrapper lines stay whole, so they must be a small part of the text.
    wrapper = sum(len(line) for line, flag in zip(lines, is_file_line, strict=True) if not flag)
    if wrapper > max(2000, len(text) // 4):
        return None
    starts = [m.end() if flag and m else 0 for m, flag in zip(matches, is_file_line, strict=True)]
    return FileView(lines, is_file_line, starts, numbers[0] <= 1, numbered=True)


def shown_line_numbers(text: str) -> list[tuple[int, int]] | None:
    """For a numbered file view, (the number a line shows, its index in ``text.split("\\n")``)
    for each file line in order; None when ``text`` is not a numbered file view. Wrapper lines
    (OpenCode's ``<path>``/``<content>``, SWE-agent's ``[File: …]``) have no number."""
    view = _parse(text)
    if view is None:
        return None
    numbered: list[tuple[int, int]] = []
    for index, (line, flag) in enumerate(zip(view.lines, view.is_file_line, strict=True)):
        match = flag and (_NUMBER_PREFIX.match(line, 0, 24) or _PADDED_NUMBER.match(line, 0, 24))
        if match:
            numbered.append((int(match.group(1)), index))
    return numbered


def _prints_a_file(output: ToolOutput) -> bool:
    """Whether the call itself says that it printed a file, so un-numbered text is one."""
    key = output.tool_key
    if key in SHELL_TOOLS:
        command = command_text(output.arguments)
        return "|" not in command and shell_program(command) in _READ_PROGRAMS
    return key in _READ_TOOLS


# Codex CLI's shell_command output starts with these lines before the program's own output.
_SHELL_HEADER = re.compile(
    r"(?:Exit code: -?\d+\n)?(?:Wall time: [^\n]*\n)?(?:Total output lines: \d+\n)?Output:\n"
)
_SED_RANGE = re.compile(r"^\s*sed\s+-n\s+['\"]?(\d+)\s*,\s*(?:\d+|\$)\s*p['\"]?\s+[^|;&]+$")
_FROM_TOP = re.compile(r"^\s*(?:cat|head(?:\s+-n\s*\d+|\s+-\d+)?)\s+[^|;&<>]+$")


def _first_line_number(output: ToolOutput) -> int | None:
    """The file line an un-numbered view starts at, when the command says so:
    ``sed -n 'A,Bp' file`` starts at A, ``cat file`` and ``head file`` at 1."""
    command = command_text(output.arguments)
    sed = _SED_RANGE.match(command)
    if sed:
        return int(sed.group(1))
    return 1 if _FROM_TOP.match(command) else None


def _parse_plain(text: str, first_number: int | None = None) -> FileView | None:
    """Un-numbered file text, every line a file line (a shell's header line excepted); not
    JSON (that is json_crush's)."""
    header = _SHELL_HEADER.match(text)
    header_lines = header.group(0).count("\n") if header else 0
    stripped = text[header.end() if header else 0 :].strip()
    if stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
        return None
    lines = text.split("\n")
    filled = sum(1 for line in lines if line.strip())
    if filled < MIN_FILE_LINES * 2 or filled < len(lines) // 2:
        return None
    is_file_line = [index >= header_lines for index in range(len(lines))]
    return FileView(
        lines, is_file_line, [0] * len(lines), True, numbered=False, first_number=first_number
    )


# --- choosing lines ---------------------------------------------------------------------------


class _Selection:
    """The kept lines and what they cost; a line next to a kept line needs no gap line."""

    def __init__(self, view: FileView, max_chars: int) -> None:
        self.lines = view.lines
        cap = max(MIN_LINE_CAP, max_chars // LINE_SHARE)
        self.cut = {i: _cut(line, cap) for i, line in enumerate(view.lines) if len(line) > cap}
        self.kept: set[int] = set()
        self.spent = 0

    def cost(self, index: int) -> int:
        size = len(self.cut.get(index, self.lines[index])) + 1
        neighbours = (index - 1 in self.kept) + (index + 1 in self.kept)
        return size + (GAP_COST, 0, -GAP_COST)[neighbours]

    def take(self, index: int, limit: float) -> bool:
        if index in self.kept:
            return True
        cost = self.cost(index)
        if self.spent + cost > limit:
            return False
        self.kept.add(index)
        self.spent += cost
        return True


def _cut(line: str, cap: int) -> str:
    return f"{line[:cap]} {gap_line(len(line) - cap, 'characters')}"


def _choose(
    view: FileView,
    contents: Sequence[str],
    tokens: Sequence[set[str]],
    max_chars: int,
    focus: frozenset[str],
) -> _Selection:
    """The lines to keep: wrapper, head and tail, lines about the task, structure, then
    identifier coverage."""
    selection = _Selection(view, max_chars)
    file_lines = [i for i, flag in enumerate(view.is_file_line) if flag]
    for index, flag in enumerate(view.is_file_line):
        if not flag:
            selection.take(index, float("inf"))

    head_limit = selection.spent + max(max_chars - selection.spent, 0) * HEAD_SHARE
    for count, index in enumerate(file_lines):
        if not view.starts_at_top and count >= WINDOW_HEAD_LINES:
            break
        if not selection.take(index, head_limit):
            break
    for index in file_lines[-TAIL_LINES:]:
        selection.take(index, max_chars)

    if focus:
        about_task = {
            name
            for name in set().union(*(tokens[i] for i in file_lines))
            if not focus.isdisjoint(name_parts(name))
        }
        hits = {i: len(tokens[i] & about_task) for i in file_lines}
        relevant = [i for _, i in sorted((-n, i) for i, n in hits.items() if n)]
        limit = selection.spent + max(max_chars - selection.spent, 0) * FOCUS_SHARE
        for index in relevant:
            selection.take(index, limit)
    weights = _structure_weights(contents, file_lines)
    ranked = sorted(weights, key=lambda i: (-weights[i], i))
    if len(file_lines) > COVERAGE_LINES:  # too many to weigh every identifier in time
        for index in ranked:
            selection.take(index, max_chars)
        return selection
    limit = selection.spent + max(max_chars - selection.spent, 0) * STRUCTURE_SHARE
    for index in ranked:
        selection.take(index, limit)
    _cover_identifiers(selection, file_lines, tokens, max_chars)
    return selection


def _structure_weights(contents: Sequence[str], file_lines: Sequence[int]) -> dict[int, float]:
    """The structural lines and their weights (see ``_structure_weight``)."""
    stripped = {i: contents[i].lstrip() for i in file_lines}
    indent = {i: len(contents[i]) - len(text) for i, text in stripped.items() if text}
    base = min(indent.values(), default=0)
    weights = {i: _structure_weight(stripped[i], depth <= base) for i, depth in indent.items()}
    return {i: weight for i, weight in weights.items() if weight > 0}


def _structure_weight(stripped: str, top: bool) -> float:
    """How much a line says about the file's structure; 0 for ordinary lines."""
    if stripped[0] in _MARK_CHARS:
        if _HEADING.match(stripped):
            return 6.0 if top else 0.0
        if _DECORATOR.match(stripped):
            return 4.0
        if top and _IMPORT.match(stripped):
            return 3.5
        return 2.0 if _SECTION_COMMENT.match(stripped) else 0.0
    word = _LEAD_WORD.match(stripped)
    lead = word.group() if word else ""
    if lead in _STRUCTURE_WORDS:
        if _DECLARATION.match(stripped):
            return 7.0 if top else 6.0
        if _FUNCTION.match(stripped) or _ARROW_FUNCTION.match(stripped):
            return 6.5 if top else 5.0
        if _METHOD_LIKE.match(stripped) and not stripped.endswith(";"):
            return 4.5
        if top and _IMPORT.match(stripped):
            return 3.5
    elif stripped[-1] == "{" and lead not in _CONTROL_WORDS and _BRACE_SIGNATURE.match(stripped):
        return 5.5 if top else 4.5
    if top and (_ASSIGNMENT.match(stripped) or _KEY_LINE.match(stripped)):
        return 3.0
    return 0.0


def _cover_identifiers(
    selection: _Selection, file_lines: Sequence[int], found: Sequence[set[str]], max_chars: int
) -> None:
    """Greedily add the lines that show the most not-yet-visible identifiers per character."""
    kept = selection.kept
    seen: set[str] = set().union(*(found[index] for index in file_lines if index in kept))
    weight = {token: _token_weight(token) for token in set().union(*found)}
    useful = {token for token, value in weight.items() if value > 0}
    tokens = {
        index: names
        for index in file_lines
        if index not in kept and (names := found[index] & useful)
    }

    def gain(index: int) -> float:
        value = sum([weight[token] for token in tokens[index] - seen])
        return value / max(selection.cost(index), 1)

    heap = [(-gain(index), index) for index in tokens]
    heapq.heapify(heap)
    while heap and selection.spent < max_chars:
        _, index = heapq.heappop(heap)
        if index in kept or selection.spent + selection.cost(index) > max_chars:
            continue
        current = gain(index)
        if current <= 0:
            continue
        if heap and current < -heap[0][0]:
            heapq.heappush(heap, (-current, index))  # stale: its gain fell since it was pushed
            continue
        selection.take(index, max_chars)
        seen |= tokens[index]
        for neighbour in (index - 1, index + 1):
            if neighbour in tokens and neighbour not in kept:
                heapq.heappush(heap, (-gain(neighbour), neighbour))  # now cheaper to add


def _tokens(content: str) -> set[str]:
    """Identifiers of a line: dotted chains and their parts, and slashed paths (an import's
    module, a file a line names)."""
    found = set(_IDENTIFIER.findall(content))
    if "." in content:
        for chain in [chain for chain in found if "." in chain]:
            found.update(chain.split("."))
    if "/" in content:
        found.update(_PATH.findall(content))
    return found


@lru_cache(maxsize=65536)  # a pure function of the name; identifiers repeat across outputs
def _token_weight(token: str) -> float:
    if len(token) < 3 or token.lower() in _COMMON_WORDS:
        return 0.0
    size = min(len(token), 30) / 8
    if "_" in token.strip("_") or "." in token or token[1:] != token[1:].lower():
        return 2.0 + size  # compound names (snake_case, camelCase, a.b) are what agents cite
    if token[0].isupper():
        return 1.5 + size
    return 0.5 + size / 2  # a plain word, often prose in a comment or docstring
