"""Command and test-runner output: pytest, unittest, go test, cargo, jest, tsc, eslint, Python
tracebacks, pip/npm installs, and any other log.

Every line gets a score: agent trailers and result summaries highest, then failure headers and
error messages, their locations and last traceback frames, other error-ish lines and their
neighbours, ordinary lines by how many identifiers they carry, and progress noise (passing
tests, downloads, dots) nothing. The head and tail are kept, then lines by score until the
budget is spent; runs of left-out lines become gap lines, repeated lines collapse to one.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from compressors.markers import GAP_COST, gap_line
from compressors.outputs import Budget, Compressed, ToolOutput
from compressors.tools import search

SHELL_TOOLS = frozenset(
    {"bash", "execute_bash", "shell", "run", "run_command", "terminal", "exec",
     "execute_command", "command", "run_terminal_cmd", "powershell", "sh"}
)  # fmt: skip

# Scores, highest kept first.
TRAILER = 300  # agent harness lines: (Open file: …), bash-$, [Command finished …]
SUMMARY = 200  # the run's result: "=== 1 failed, 3 passed in 0.5s ===", "Ran 4 tests"
HEADLINE = 150  # one per problem: failing test id, exception line, "error[E0308]: …"
DETAIL = 100  # what and where: pytest "E   " lines, "file.py:12: Error", "-->", last frames
FRAME = 70  # the rest of a traceback, the failing source line
ERRORISH = 60  # any other line saying error / fail / exception / …
RESULT = 45  # one package's or file's result among many: "ok  pkg 0.1s"
WARNING = 40
CONTEXT = 30  # a neighbour of a headline or error line
LIBRARY_FRAME = 25  # a traceback frame inside an installed library
BODY_MAX = 20  # ordinary lines: 1 + identifiers they carry
NOISE = 0  # kept only as head or tail
REPEAT = -1  # a repeat of the line above: never kept

TRAILER_LINES = 8  # agent trailers among an output's last lines are kept whatever the budget
KIND_WINDOW = 8000  # chars at each end of a long output that decide its kind
E_LINES = 6  # pytest "E   " lines per failure that count as DETAIL

# --- kinds --------------------------------------------------------------------------------

PYTEST, UNITTEST, GO, CARGO, JEST, TSC, ESLINT, TRACEBACK, INSTALL, GENERIC = (
    "pytest", "unittest", "go", "cargo", "jest", "tsc", "eslint", "traceback", "install",
    "generic",
)  # fmt: skip

_PYTEST_RESULT = re.compile(
    r"^=+ .*\b(?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|no tests ran)\b"
    r".* in [\d.]+m?s\b",
    re.M,
)
_UNITTEST_RAN = re.compile(r"^Ran \d+ tests? in ", re.M)
_GO_RESULT = re.compile(
    r"^(?:--- (?:FAIL|PASS): |(?:ok|FAIL)\s+\S+\s+(?:[\d.]+s|\(cached\)))", re.M
)
_CARGO = re.compile(r"^(?:error|warning)(?:\[E\d+\])?: .*\n\s+--> \S+:\d+:\d+", re.M)
_TSC = re.compile(r"\(\d+,\d+\): error TS\d+:|:\d+:\d+ - error TS\d+:")
_ESLINT = re.compile(r"^\s+\d+:\d+\s+(?:error|warning)\s{2}", re.M)
_EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b")
_INSTALL_ENDINGS = ("Successfully installed", "ERROR: ", "npm ERR!", "npm error", "added ",
                    "up to date", "found 0 vulnerabilities")  # fmt: skip
_INSTALL_MARKERS = ("Requirement already satisfied", "Successfully installed ",
                    "Installing collected packages", "\nCollecting ", "npm ERR!", "npm WARN",
                    "npm error", "up to date, audited")  # fmt: skip


def detect_kind(text: str) -> str:
    """The runner that produced ``text``, or GENERIC. Substring tests first: they are cheap,
    and a regex runs only when a substring says it may match. Runners print their banner at
    the start and their summary at the end, so a long log is judged by its two ends."""
    if len(text) > 2 * KIND_WINDOW:
        text = text[:KIND_WINDOW] + "\n" + text[-KIND_WINDOW:]
    tail = text[-3000:]
    if "test session starts" in text or "short test summary info" in text:
        return PYTEST
    if ("passed" in tail or "failed" in tail or "error" in tail) and _PYTEST_RESULT.search(tail):
        return PYTEST
    if "Ran " in tail and _UNITTEST_RAN.search(tail):
        return UNITTEST
    if "--- FAIL: " in text or "--- PASS: " in text or _GO_RESULT.search(tail):
        return GO
    if "error[E" in text or "test result: " in text or ("--> " in text and _CARGO.search(text)):
        return CARGO
    if "Test Suites:" in tail or ("Tests:" in tail and "●" in text):
        return JEST
    if "error TS" in text and _TSC.search(text):
        return TSC
    if ("  error  " in text or "  warning  " in text) and _ESLINT.search(text):
        return ESLINT
    if "Traceback (most recent call last):" in text:
        return TRACEBACK
    if any(marker in text for marker in _INSTALL_MARKERS):
        return INSTALL
    return GENERIC


# Line rules: (score, first characters, pattern matched at the line's start). A line is only
# matched against the rules for its first character, one compiled pattern per character, so
# most lines cost one dict lookup.
_WS = " \t"
_RULE_TABLE: tuple[tuple[float, str, str], ...] = (
    # agent harness trailers
    (TRAILER, "(", r"\((?:Open file|Current directory): "),
    (TRAILER, "b", r"bash-\$"),
    (TRAILER, "r", r"root@[\w.-]+:\S* [#$] ?$"),
    # results of the whole run
    (SUMMARY, "=", r"=+ .*\b(?:passed|failed|errors?|skipped|no tests ran)\b.*=+$"),
    (SUMMARY, "R", r"Ran \d+ tests? in "),
    (SUMMARY, "FO", r"(?:FAILED|OK)(?: \(.*\))?$|FAIL$|FAIL\s+\S+\s+(?:[\d.]+s|\(cached\))"),
    (SUMMARY, "F", r"Found \d+ errors?"),
    (SUMMARY, "t", r"test result: "),
    (SUMMARY, "TS", r"(?:Tests|Test Suites|Snapshots):\s"),
    (SUMMARY, "✖" + _WS, r"\s*✖ \d+ problems?"),
    (SUMMARY, "S", r"Successfully (?:installed|built) "),
    (SUMMARY, "a", r"added \d+ packages?"),
    (SUMMARY, "e", r"error: could not compile"),
    (SUMMARY, "w", r"warning: .* generated \d+ warnings?"),
    (SUMMARY, "0123456789", r"\d+ (?:errors?|warnings?)\b"),
    # one line per problem
    (HEADLINE, "_", r"_{3,} .* _{3,}$"),
    (HEADLINE, "FE", r"(?:FAILED|ERROR):? \S|FAIL: \S|FAILURES:$"),
    (HEADLINE, "=", r"=+ (?:FAILURES|ERRORS) =+$"),
    (HEADLINE, "-", r"--- FAIL: |---- \S+ stdout ----$"),
    (HEADLINE, "p", r"panic: "),
    (HEADLINE, "e", r"error(?:\[E\d+\])?: "),
    (HEADLINE, "t", r"thread '.*' panicked at|test \S+ \.\.\. FAILED"),
    (HEADLINE, "f", r"failures:$"),
    (HEADLINE, "F●✕" + _WS, r"\s*(?:FAIL\s+\S|● |✕ )"),
    (HEADLINE, "T", r"Traceback \(most recent call last\):|The above exception was the direct"),
    (HEADLINE, "D", r"During handling of the above exception"),
    (HEADLINE, _WS, r"\s+\d+:\d+\s+error\s"),
    (HEADLINE, "n", r"npm (?:ERR!|error) "),
    # what failed and where
    (DETAIL, "E", r"E {3}"),
    (DETAIL, _WS, r"\s+\S+_test\.go:\d+: "),
    # one result among many, frames of other languages
    (RESULT, "o", r"ok\s+\S+\s+(?:[\d.]+s|\(cached\))"),
    # git: which commit, which file, which hunk
    (RESULT, "c", r"commit [0-9a-f]{7,64}\b"),
    (RESULT, "d", r"diff --git "),
    (RESULT, "+-", r"(?:\+\+\+|---) [ab]/"),
    (RESULT, "@", r"@@ -\d"),
    (RESULT, _WS, r"\s+\d+:\d+\s+warning\s"),
    (FRAME, _WS, r"\s+at .*:\d+:\d+\)?$"),
)


def _build_rules() -> dict[str, tuple[re.Pattern[str], dict[str, float]]]:
    by_char: dict[str, list[tuple[float, str]]] = {}
    for score, chars, pattern in _RULE_TABLE:
        for char in chars:
            by_char.setdefault(char, []).append((score, pattern))
    rules = {}
    for char, entries in by_char.items():
        groups = {f"s{i}": score for i, (score, _) in enumerate(entries)}
        pattern = "|".join(f"(?P<s{i}>{p})" for i, (_, p) in enumerate(entries))
        rules[char] = (re.compile(pattern), groups)
    return rules


_RULES = _build_rules()
# Anywhere in a line: OpenHands appends its trailers to the last line of output.
_TRAILER_INSIDE = ("[Command finished with exit code", "[Python Interpreter: ",
                   "[The command completed with exit code")  # fmt: skip
_LOCATED_ERROR = re.compile(r"\S+:\d+: [\w.]*(?:Error|Exception|Failed|Failure|Exit|Interrupt)\b")
_PY_FRAME = re.compile(r'^\s*File ".*", line \d+')
_PYTEST_FRAME = re.compile(r"^\S+:\d+: (?:in \S+)?$|^\S+:\d+: in ")
_LIBRARY_PATHS = (
    "site-packages", "dist-packages", "/lib/python", "node_modules", "/usr/lib/", "<frozen ",
    "/rustc/", "/.cargo/registry/", "/go/pkg/mod/", "\\lib\\",
)  # fmt: skip
_BANNER = re.compile(r"^=+ (.*?) =+$")
_NOISE_PREFIXES = (
    "Requirement already satisfied", "Collecting ", "Downloading ", "Using cached ",
    "Obtaining ", "=== RUN ", "=== PAUSE ", "=== CONT ", "--- PASS: ", "PASS ", "npm http ",
    "npm timing ", "npm sill ", "npm verb ", "  Downloading ", "  Using cached ",
    "  Obtaining ", "   Compiling ", "  Downloaded ", "   Downloaded ",
    "  Installing build dependencies", "  Getting requirements", "  Preparing ",
    "  Checking if build backend", "  Building editable", "  Building wheel", "  Stored in ",
    "  Attempting uninstall", "    Found existing installation", "    Uninstalling ",
    "      Successfully uninstalled", "  Created wheel", "  ✓ ", "    ✓ ", "      ✓ ", "  √ ",
    "    √ ", " PASS ",
)  # fmt: skip


def _by_first_char(prefixes: Sequence[str]) -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for prefix in prefixes:
        table[prefix[0]] = (*table.get(prefix[0], ()), prefix)
    return table


_NOISE = _by_first_char(_NOISE_PREFIXES)
_NOISE_TAIL = (" PASSED", " ok", " ... ok", " ... done", " done", " passed")
_PROGRESS = re.compile(r"\S+ [.sxX]+ *(?:\[ *\d+%\])?$|[.sxX]+$")  # pytest's dots, and rows of dots
# Words that make a line error-ish, looked for with str.find in the lowered text (a regex
# alternation over the whole text is several times slower).
_ERROR_WORDS = ("error", "fail", "exception", "fatal", "panic", "denied", "cannot", "not found",
                "no such file", "invalid")  # fmt: skip
_WARNING_WORDS = ("warn",)
# A word inside a file name (exceptions.py, errors.go) says nothing about the line.
_IN_FILE_NAME = re.compile(r"[\w-]*\.[A-Za-z]{1,5}\b")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FILE_VIEW = re.compile(
    r"^\[File: .* \(\d+ lines total\)\]$|^Here's the result of running `cat -n`"
)


@dataclass(frozen=True, slots=True)
class _Plan:
    """How much of the head and tail a kind keeps unconditionally."""

    head_lines: int
    head_share: float
    tail_share: float


_PLANS = {
    GENERIC: _Plan(40, 0.2, 0.25),
    INSTALL: _Plan(2, 0.05, 0.2),
    TRACEBACK: _Plan(10, 0.1, 0.2),
}
_RUNNER_PLAN = _Plan(2, 0.05, 0.15)


def recognises(output: ToolOutput, budget: Budget) -> bool:
    kind = _log_kind(output, budget)
    if kind is None:
        return False
    if output.tool_key in SHELL_TOOLS and kind == GENERIC and _is_file_view(output.text):
        return search.is_search_context(output) and search.recognises(output, budget)
    return True


def _log_kind(output: ToolOutput, budget: Budget) -> str | None:
    """The runner of a log this compressor takes (GENERIC: a shell tool's other output)."""
    text = output.text
    if len(text) <= budget.max_chars:
        return None
    kind = detect_kind(text)
    if output.tool_key not in SHELL_TOOLS:
        # Tried by shape: only an output that is clearly a runner's log is ours.
        return kind if _is_clear_log(text, kind) else None
    return kind


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    kind = _log_kind(output, budget)
    if kind is None:
        return None
    text = output.text
    if output.tool_key in SHELL_TOOLS and kind == GENERIC:
        if search.is_search_context(output):
            delegated = search.compress(output, budget)
            if delegated is not None:
                return delegated
        if _is_file_view(text):
            return None  # left to the file-view compressor, tried next by shape
    return compress_log(text, kind, budget.max_chars)


def _is_clear_log(text: str, kind: str) -> bool:
    """Test runners and compilers are recognised by summary lines nothing else prints; a
    traceback or an install log only when the output ends the way those do (a document that
    merely quotes one is not a log)."""
    if kind == GENERIC:
        return False
    if kind not in (TRACEBACK, INSTALL):
        return True
    ending = text.rstrip()[-600:].rsplit("\n", 4)[-4:]
    if kind == TRACEBACK:
        return any(_EXCEPTION_LINE.match(line) for line in ending)
    return any(line.startswith(_INSTALL_ENDINGS) for line in ending)


def _is_file_view(text: str) -> bool:
    head = text[:2000].split("\n", 6)[:6]
    return any(_FILE_VIEW.match(line) for line in head)


def compress_log(text: str, kind: str, max_chars: int) -> Compressed | None:
    """``text`` as a log of ``kind`` in about ``max_chars``; None when that saves too little."""
    size = len(text)
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    limit = max(500, max_chars // 4)
    shown = [line if len(line) <= limit else _clip(line, limit) for line in lines]
    if any(len(line) > limit for line in lines):
        text = "\n".join(shown)  # a huge line is judged by what is shown of it
    plain, lowered = _plain(text, shown)
    scores = _scores(plain, lowered, kind)
    plan = _PLANS.get(kind, _RUNNER_PLAN)
    kept = _select(shown, scores, max_chars, plan)
    body = _render(shown, kept, lines)
    if len(body) > 0.8 * size:
        return None
    return Compressed(body, _omitted(lines, kept, limit))


def _plain(text: str, lines: list[str]) -> tuple[list[str], str]:
    """Lines as a terminal shows them (no colour codes, no CR line ends, only the last of the
    segments a progress bar separates with CR), and all of them joined and lowered."""
    if "\x1b[" not in text and "\r" not in text:
        return lines, text.lower()
    out = [_ANSI.sub("", line) if "\x1b[" in line else line for line in lines]
    out = [line.rstrip("\r") for line in out]
    out = [line.rsplit("\r", 1)[-1] if "\r" in line else line for line in out]
    return out, "\n".join(out).lower()


def _clip(line: str, limit: int) -> str:
    """A line longer than ``limit``: its start and end, with the middle's length."""
    head = limit * 2 // 3
    tail = limit - head
    return f"{line[:head]} {gap_line(len(line) - limit, 'characters')} {line[-tail:]}"


# --- scoring ------------------------------------------------------------------------------


def _scores(lines: list[str], lowered: str, kind: str) -> list[float]:
    scores = _base_scores(lines, lowered, kind)
    _mark_errorish(lines, lowered, scores)
    if kind == PYTEST:
        _score_pytest(lines, scores)
    elif kind == CARGO:
        _score_cargo(lines, scores)
    elif kind == ESLINT:
        _score_eslint(lines, scores)
    if kind in (TRACEBACK, PYTEST, UNITTEST) or "traceback (most recent call last)" in lowered:
        _score_tracebacks(lines, scores)
    _add_context(scores)
    _mark_repeats(lines, scores)
    return scores


def _base_scores(lines: list[str], lowered: str, kind: str) -> list[float]:
    """Scores from each line alone. Written as one loop with local names: it runs per line."""
    rules_for = _RULES.get
    noise_for = _NOISE.get
    noise_tail = _NOISE_TAIL
    located = kind in (PYTEST, UNITTEST, TRACEBACK) and _LOCATED_ERROR.match
    tsc = "error ts" in lowered
    progress = _PROGRESS.match
    scores: list[float] = []
    append = scores.append
    for line in lines:
        if not line or line.isspace():
            append(NOISE)
            continue
        first = line[0]
        rules = rules_for(first)
        if rules is not None:
            found = rules[0].match(line, 0, 2000)
            if found is not None:
                append(rules[1][found.lastgroup or ""])
                continue
        if (tsc and "error TS" in line) or (located and ": " in line and located(line, 0, 2000)):
            append(HEADLINE if tsc and "error TS" in line else DETAIL)
            continue
        prefixes = noise_for(first)
        last = line[-1]
        if (
            (prefixes is not None and line.startswith(prefixes))
            or " PASSED" in line
            or line.endswith(noise_tail)
            or ((last == "." or (last == "]" and line.endswith("%]"))) and progress(line))
        ):
            append(NOISE)
            continue
        density = line.count("_") + line.count("/") + line.count(".")
        append(1 + (density if density < BODY_MAX else BODY_MAX - 1))
    for index in range(max(0, len(lines) - 3), len(lines)):
        if any(trailer in lines[index] for trailer in _TRAILER_INSIDE):
            scores[index] = TRAILER
    return scores


def _mark_errorish(lines: list[str], lowered: str, scores: list[float]) -> None:
    """Error and warning lines: each word looked for in the lowered text, once per line."""
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))
    last = len(lines) - 1
    for words, score in ((_WARNING_WORDS, WARNING), (_ERROR_WORDS, ERRORISH)):
        for word in words:
            at = lowered.find(word)
            while at >= 0:
                index = bisect.bisect_right(starts, at) - 1
                if index > last:
                    break
                if NOISE < scores[index] < score and not _in_file_name(lowered, at, len(word)):
                    scores[index] = score
                at = lowered.find(word, starts[index + 1])


def _in_file_name(text: str, at: int, length: int) -> bool:
    return text[at - 1 : at] == "/" or _IN_FILE_NAME.match(text, at + length) is not None


def _score_pytest(lines: list[str], scores: list[float]) -> None:
    """Inside FAILURES/ERRORS: frames nearest each error and the first E lines count most;
    the PASSES section is noise."""
    section = ""
    block: list[int] = []
    for index, line in enumerate(lines):
        banner = _BANNER.match(line) if line.startswith("=") else None
        if banner is not None:
            section = banner.group(1).strip().lower()
            _score_failure(lines, scores, block)
            block = []
            continue
        if section not in ("failures", "errors", "passes"):
            continue
        if section == "passes" and scores[index] < HEADLINE:
            scores[index] = NOISE
        elif line.startswith("___") and scores[index] == HEADLINE:
            _score_failure(lines, scores, block)
            block = [index]
        elif block:
            block.append(index)
    _score_failure(lines, scores, block)


def _score_failure(lines: list[str], scores: list[float], block: list[int]) -> None:
    """One failure: the test's own frame and the frame that raised (with their ``>`` source
    lines) rank as details, frames between them by whether they are project code."""
    sections: list[list[int]] = [[]]
    for index in block:
        if lines[index].startswith("_ _ _"):
            sections.append([])
        else:
            sections[-1].append(index)
    in_order = [i for i in block if _PYTEST_FRAME.match(lines[i])]
    frames, last_frames = set(in_order), set(_nearest_frames(lines, in_order))
    for number, section in enumerate(sections):
        ends = number in (0, len(sections) - 1)
        for index in section:
            line = lines[index]
            if index in last_frames or (ends and index in frames):
                scores[index] = max(scores[index], DETAIL)
            elif index in frames:
                scores[index] = max(scores[index], _frame_score(line))
            elif line.startswith(">   "):
                score = DETAIL if ends else min(FRAME, _frame_score(lines[section[-1]]))
                scores[index] = max(scores[index], score)
    e_lines = 0
    for index in block:
        if lines[index].startswith("E   "):
            e_lines += 1
            scores[index] = DETAIL if e_lines <= E_LINES else FRAME


def _nearest_frames(lines: list[str], frames: list[int]) -> list[int]:
    """The frame nearest the error, and the one before it unless that is library code."""
    nearest = frames[-1:]
    if len(frames) > 1 and _frame_score(lines[frames[-2]]) == FRAME:
        nearest.append(frames[-2])
    return nearest


def _frame_score(line: str) -> float:
    """A frame in project code says more than one in an installed library."""
    return LIBRARY_FRAME if any(part in line for part in _LIBRARY_PATHS) else FRAME


def _score_cargo(lines: list[str], scores: list[float]) -> None:
    """A rustc diagnostic runs from its ``error``/``warning`` line to the next blank line; its
    ``-->`` location and labelled lines rank with the diagnostic."""
    level = NOISE
    for index, line in enumerate(lines):
        if not line.strip():
            level = NOISE
        elif line.startswith("error"):
            level = DETAIL
        elif line.startswith("warning"):
            level = WARNING
        elif level and line.lstrip().startswith(("-->", "= note", "= help", "|")):
            bonus = line.lstrip().startswith("-->") or "^" in line
            scores[index] = max(scores[index], level if bonus else level // 2)


def _score_eslint(lines: list[str], scores: list[float]) -> None:
    """The file header above a run of ``line:col  error  message  rule`` lines: the one line
    that says which file they are in, so it goes first."""
    for index, line in enumerate(lines[:-1]):
        header = bool(line) and not line[0].isspace() and " " not in line.strip()
        if header and scores[index + 1] in (HEADLINE, RESULT):
            scores[index] = max(scores[index], HEADLINE + 1)


def _score_tracebacks(lines: list[str], scores: list[float]) -> None:
    """Each ``Traceback (most recent call last):`` block: its frames, the last ones and their
    source lines highest, and the exception line that ends it."""
    index = 0
    count = len(lines)
    while index < count:
        if not lines[index].startswith("Traceback (most recent call last):"):
            index += 1
            continue
        end = index + 1
        while end < count and lines[end][:1].isspace():
            end += 1
        frames = [i for i in range(index + 1, end) if _PY_FRAME.match(lines[i])]
        nearest = _nearest_frames(lines, frames)
        for frame in frames:
            last = frame in nearest
            score = DETAIL if last else _frame_score(lines[frame])
            scores[frame] = max(scores[frame], score)
            source = frame + 1
            if source < end and not _PY_FRAME.match(lines[source]) and score > LIBRARY_FRAME:
                scores[source] = max(scores[source], FRAME if last else CONTEXT)
        if end < count and lines[end]:
            scores[end] = max(scores[end], HEADLINE)
        index = end


def _add_context(scores: list[float]) -> None:
    """One line either side of a headline or error line is worth keeping with it."""
    count = len(scores)
    for index, score in enumerate(list(scores)):
        if ERRORISH <= score <= HEADLINE:
            for near in (index - 1, index + 1):
                if 0 <= near < count and NOISE < scores[near] < CONTEXT:
                    scores[near] = CONTEXT


def _mark_repeats(lines: list[str], scores: list[float]) -> None:
    for index in range(1, len(lines)):
        if lines[index] == lines[index - 1] and scores[index] < TRAILER:
            scores[index] = REPEAT


# --- selection and rendering --------------------------------------------------------------


def _select(lines: Sequence[str], scores: list[float], max_chars: int, plan: _Plan) -> list[int]:
    """The final trailers, then the head and the tail (its noise skipped), then lines by score
    (earlier first on ties)."""
    kept: set[int] = set()
    spent = 0

    def take(index: int) -> bool:
        nonlocal spent
        cost = len(lines[index]) + 1 + GAP_COST // 2
        if spent + cost > max_chars:
            return False
        kept.add(index)
        spent += cost
        return True

    count = len(lines)
    for index in range(max(0, count - TRAILER_LINES), count):  # harness trailers end an output
        if scores[index] >= TRAILER:
            kept.add(index)
            spent += len(lines[index]) + 1
    head_budget = spent + int(max_chars * plan.head_share)
    for index in range(min(plan.head_lines, count)):
        if scores[index] != REPEAT and (spent >= head_budget or not take(index)):
            break
    tail_budget = spent + int(max_chars * plan.tail_share)
    for index in range(count - 1, -1, -1):
        if index in kept or scores[index] <= NOISE:
            continue
        if spent >= tail_budget or not take(index):
            break
    # A stable sort keeps equal scores in line order.
    ranked = sorted(
        (index for index in range(count) if scores[index] > NOISE and index not in kept),
        key=scores.__getitem__,
        reverse=True,
    )
    for index in ranked:
        if not take(index) and spent > max_chars - GAP_COST:
            break
    _fill_holes(lines, scores, kept)
    return sorted(kept)


def _fill_holes(lines: Sequence[str], scores: list[float], kept: set[int]) -> None:
    """A lone left-out short line costs about as much as the gap line that would replace it:
    show the line instead."""
    for index in range(1, len(lines) - 1):
        if (
            index not in kept
            and index - 1 in kept
            and index + 1 in kept
            and len(lines[index]) <= 2 * GAP_COST
            and scores[index] != REPEAT
        ):
            kept.add(index)


def _render(shown: Sequence[str], kept: Sequence[int], original: Sequence[str]) -> str:
    out: list[str] = []
    previous = -1
    for index in [*kept, len(shown)]:
        if index > previous + 1:
            out.append(_gap(original, previous, index))
        if index < len(shown):
            out.append(shown[index])
        previous = index
    return "\n".join(out)


def _gap(lines: Sequence[str], previous: int, stop: int) -> str:
    count = stop - previous - 1
    if previous >= 0 and all(lines[i] == lines[previous] for i in range(previous + 1, stop)):
        return gap_line(count, "identical lines")
    return gap_line(count, "lines")


def _omitted(lines: Sequence[str], kept: Sequence[int], limit: int) -> str:
    parts = []
    if len(kept) < len(lines):
        parts.append(f"{len(lines) - len(kept)} of {len(lines)} lines omitted")
    clipped = [len(lines[i]) - limit for i in kept if len(lines[i]) > limit]
    if clipped:
        noun = "line" if len(clipped) == 1 else "lines"
        parts.append(f"{sum(clipped)} characters cut from {len(clipped)} long {noun}")
    return ", ".join(parts)
