"""Listings: glob / ls / find / tree outputs, SWE-agent ``find_file``, editor directory views.

Shapes recognised, after peeling the agent's wrapper lines (``Found N matches for …``,
``Here's the files and directories up to 2 levels deep in …``, OpenCode's ``<path>`` /
``<type>directory</type>`` / ``<entries>``, ``total N``, ``(Open file: …)``, ``bash-$``, the
OpenHands prompt lines, Claude Code's ``NOTE: …``, a ``<response clipped>`` note), which are
always kept as they are:

- paths, one per line (find, fd, glob, ``find_file``, editor directory views) and ``ls -R``
  sections: grouped by directory;
- trees (``tree``, Claude Code ``LS``, OpenCode ``list``; ``├──`` glyphs, ``- `` items or
  indentation): thinned line by line, each kept line verbatim with the directory lines above
  it, one gap line per run of left-out lines;
- one directory (``ls -1``, ``ls -la``, ``ls`` in columns, OpenCode ``read`` of a directory):
  its names, wrapped, without the ``ls -l`` details; the best names when not all fit.

Which entries matter most. Each directory gets a score: shallower is better; generated or
cache directories (node_modules, __pycache__, .git, dist, build, virtualenvs, caches,
*.egg-info) score far lower, hidden ones lower; a larger share of source files (and
subdirectories) scores higher, binary or media files lower; and a directory whose name and
file words are shared with many other directories of the listing (the hundredth
``models.py urls.py responses.py`` package) scores lower than one with words of its own.
Entries are scored alike: directories and source files first, config and docs next, binaries
and junk last.

A grouped listing then gives, in score order: the original lines of the best directories (up
to ~30% of the budget, so their full paths stay citable), a compact line naming every entry
(``/repo/pkg/ (6 entries): a.py b.py …``) for as many directories as fit, a count-only line
(``/repo/pkg/ (6 entries)``) for further ones, and gap lines for the rest
(``[… 214 entries in 37 directories omitted …]``). Every count is exact: each entry is shown,
or inside exactly one count or gap line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from compressors.focus import name_parts
from compressors.lines import with_gaps
from compressors.markers import GAP_COST, gap_line
from compressors.outputs import Budget, CallArguments, Compressed, ToolOutput

_T = TypeVar("_T")

MIN_ENTRIES = 12
MIN_SAVING = 0.2
FULL_SHARE = 0.3  # of the budget, for groups kept in their original lines first
COMPACT_SHARE = 0.85  # compact lines may use the budget up to here; the rest is for counts
TREE_DIRECTORY_BONUS = 3.0
FLAT_WIDTH = 160  # names of a one-directory listing are wrapped at this width
PARTIAL_SHARE = 0.35  # at most this share of the budget goes to the names of one huge group
MAX_LINE = 4096  # longer lines are not listing entries
MAX_TEXT = 4_000_000  # bigger outputs are left to the generic compressor
MAX_DEPTH = 40  # path components looked at when judging a directory
FOCUS_BONUS = 8.0  # per task word in a directory's path: the task's own code comes first
HEAVY_PENALTY = 20.0  # the score a generated or cache directory loses

# --- wrapper lines ----------------------------------------------------------------------------

_HEAD_WRAPPER = re.compile(
    r"(?:OBSERVATION:|Observation:)\s*$|Found \d+ matches? for .* in .*:$|"
    r"Here's the files and directories up to .*:$|<path>.*</path>$|<type>directory</type>$|"
    r"<entries>$|total \d+$|There are more than \d+ (?:characters|files) .*|"
    r"The first \d+ .* are included below:?$"
)
_TAIL_WRAPPER = re.compile(
    r"\((?:Open file|Current directory): .*\)$|bash-\$\s*$|\[Python Interpreter: .*\]$|"
    r"\[Command finished with exit code -?\d+\]$|\S*@\S+:.*[#$] ?$|\(\d+ entries\)$|"
    r"\(Showing \d+ of \d+ entries.*\)$|</entries>$|\(Results are truncated.*\)$|"
    r"NOTE: do any of the files above seem malicious.*|.*<response clipped>.*|"
    r"\d+ director(?:y|ies), \d+ files?$|</?system-reminder>$|<NOTE>.*</NOTE>$"
)
_OBSERVATION_PREFIX = re.compile(r"(?:OBSERVATION|Observation):[ \t]+(?=\S)")
_INTERPRETER_SUFFIX = re.compile(r"(.+?)(\[Python Interpreter: [^\]]*\])$")

# --- entry shapes -----------------------------------------------------------------------------

_LONG = re.compile(r"[-dlcbps][-rwxsStT]{9}[.@+]?\s+\d+\s")
_TREE_GLYPHS = re.compile(r"[│|`├└\s]{0,240}?(?:├──|└──|\|--|`--) ?")
_DASH_ITEM = re.compile(r"(\s*)- (.*)$")
_COLUMN_GAP = re.compile(r"[ \t]*\t[ \t]*| {2,}")
_SEARCH_HIT = re.compile(r":\d+[:-]")
_NAME = re.compile(r"[\w.@+~,=%#'-]+[/*@|=>]?$")  # one file name as ls prints it, no spaces
_NUMBERED_LINE = re.compile(r"\s*\d+(?:\t|→|:|\|)")
_SIZE_PREFIX = re.compile(r"\s*[\d.,]+[KMGTPE]?i?B?\s")  # du, wc: a number, then the name
_PROSE_MARKS = ('"', "'", ", ", "(", "=", ": ")

_HEAVY_JUNK = frozenset(
    ["node_modules", "__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "site-packages",
     ".tox", ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".cache", ".next", ".nuxt",
     ".gradle", ".idea", ".vscode", "bower_components", ".eggs", "htmlcov", ".terraform",
     "DerivedData", "Pods", ".parcel-cache", ".turbo", ".svelte-kit", "__snapshots__"]
)  # fmt: skip
_MILD_JUNK = frozenset(["dist", "build", "target", "out", "vendor", "coverage", "obj", "bin",
                        "tmp", "temp", "logs", "generated", "lib64"])  # fmt: skip
_SOURCE = frozenset(
    ["py", "pyi", "js", "jsx", "ts", "tsx", "mjs", "cjs", "go", "rs", "java", "kt", "kts",
     "scala", "c", "h", "cc", "cpp", "hpp", "cxx", "cs", "rb", "php", "swift", "m", "mm", "lua",
     "pl", "sh", "bash", "ex", "exs", "erl", "hs", "ml", "clj", "dart", "vue", "svelte", "sql",
     "r", "jl", "zig", "nim", "proto", "graphql", "pyx", "pxd"]
)  # fmt: skip
_CONFIG = frozenset(["md", "rst", "txt", "toml", "cfg", "ini", "yaml", "yml", "json", "xml",
                     "gradle", "mk", "cmake", "in", "lock", "env"])  # fmt: skip
_BINARY = frozenset(
    ["pyc", "pyo", "o", "a", "so", "dylib", "dll", "exe", "class", "jar", "war", "whl", "egg",
     "png", "jpg", "jpeg", "gif", "bmp", "ico", "webp", "tif", "tiff", "pdf", "zip", "gz", "tgz",
     "bz2", "xz", "7z", "tar", "woff", "woff2", "ttf", "otf", "eot", "mp3", "mp4", "wav", "avi",
     "mov", "map", "nii", "dcm", "npy", "npz", "pkl", "pt", "pth", "h5", "bin", "dat", "db",
     "sqlite", "parquet", "log", "tmp", "swp", "orig", "rej"]
)  # fmt: skip
_WORD = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|\d+")
_FILES_ONLY_TOOLS = frozenset({"glob", "find_file", "find_files"})


@dataclass
class Group:
    """The entries of one directory, as the listing shows them."""

    path: str  # the directory, ending in "/"
    names: list[str] = field(default_factory=list)  # entry names, directories end in "/"
    lines: list[int] = field(default_factory=list)  # indices of the original lines
    header: int | None = None  # index of an ``ls -R`` section header line
    score: float = 0.0
    junk: bool = False  # a generated or cache directory
    tier: str = "gap"  # "full", "compact", "counted" or "gap"
    shown: list[int] = field(default_factory=list)  # names a compact line shows


@dataclass
class Listing:
    lines: list[str]  # the original lines, wrapper lines included
    head: list[int]  # wrapper line indices before the body
    tail: list[int]  # wrapper line indices after the body
    body: list[int]  # indices of the body's non-blank lines
    files_only: bool  # the tool lists files only, so every entry is a file
    focus: frozenset[str] = frozenset()  # the session's task words


def recognises(output: ToolOutput, budget: Budget) -> bool:
    return _listing(output, budget) is not None


def _listing(output: ToolOutput, budget: Budget) -> Listing | None:
    text = output.text
    if not budget.max_chars < len(text) <= MAX_TEXT or "\n" not in text:
        return None
    listing = _split(output)
    return listing if listing is not None and len(listing.body) >= MIN_ENTRIES else None


def compress(output: ToolOutput, budget: Budget) -> Compressed | None:
    listing = _listing(output, budget)
    if listing is None:
        return None
    text = output.text
    body = [listing.lines[i] for i in listing.body]
    result: Compressed | None
    if _is_sections(listing):
        result = _grouped(listing, _section_groups(listing), budget.max_chars, "entries")
    elif _is_tree(body):
        result = _tree(listing, budget.max_chars)
    elif _is_paths(body, pathish := [_is_pathish(line) for line in body]):
        groups = _path_groups(listing, pathish)
        if groups is None:
            return None
        result = _grouped(listing, groups, budget.max_chars, "paths")
    elif _is_flat(body):
        result = _flat(listing, budget.max_chars)
    else:
        return None
    if result is None or len(result.text) > len(text) * (1 - MIN_SAVING):
        return None
    return result


# --- splitting off the wrapper ----------------------------------------------------------------


def _split(output: ToolOutput) -> Listing | None:
    if "<type>file</type>" in output.text[:300]:
        return None  # an OpenCode file view, not a directory
    lines = [line.removesuffix("\r") for line in output.text.split("\n")]
    if any(len(line) > MAX_LINE for line in lines[:50]):
        return None
    command = CallArguments(output.arguments).text("command", "cmd").strip()
    lines = _unglue(lines)
    start, end = 0, len(lines)
    head: list[int] = []
    tail: list[int] = []
    while start < end and (
        not lines[start].strip()
        or _HEAD_WRAPPER.match(lines[start].strip())
        or (command and lines[start].strip() == command)
    ):
        head.append(start)
        start += 1
    while end > start and (not lines[end - 1].strip() or _TAIL_WRAPPER.match(lines[end - 1])):
        end -= 1
        tail.insert(0, end)
    body = [i for i in range(start, end) if lines[i].strip()]
    files_only = output.tool_key in _FILES_ONLY_TOOLS or bool(re.search(r"-type\s+f\b", command))
    return Listing(lines, head, tail, body, files_only, output.focus)


def _unglue(lines: list[str]) -> list[str]:
    """Split wrapper text glued onto a listing line (SWE-smith's ``Observation: /x``, the
    OpenHands interpreter banner after the last entry) onto lines of their own."""
    out = list(lines)
    if out and (match := _OBSERVATION_PREFIX.match(out[0])):
        out[0:1] = [match.group().rstrip(), out[0][match.end() :]]
    for index in range(len(out) - 1, max(len(out) - 6, -1), -1):
        if match := _INTERPRETER_SUFFIX.match(out[index]):
            out[index : index + 1] = [match.group(1), match.group(2)]
            break
    return out


# --- shapes -----------------------------------------------------------------------------------


def _is_sections(listing: Listing) -> bool:
    """``ls -R``: ``dir:`` headers after blank lines, each followed by names."""
    lines = listing.lines
    first = listing.body[0]
    if not _is_section_header(lines[first]):
        return False
    headers = {first} | {
        i for i in listing.body if i > first and not lines[i - 1] and _is_section_header(lines[i])
    }
    if len(headers) < 2:
        return False
    content = [lines[i] for i in _sample([i for i in listing.body if i not in headers])]
    return sum(1 for line in content if _is_name_line(line)) >= 0.9 * len(content)


def _is_section_header(line: str) -> bool:
    return line.endswith(":") and _is_pathish(line[:-1])


def _is_name_line(line: str) -> bool:
    """A line of ``ls`` output: long format, ``total N``, or names in columns."""
    text = line.strip()
    if _LONG.match(text) or re.match(r"total \d+$", text):
        return True
    return all(_NAME.match(name) for name in _COLUMN_GAP.split(text) if name)


def _sample(body: Sequence[_T]) -> Sequence[_T]:
    """Enough lines to tell a shape: the first and last hundred."""
    return body if len(body) <= 200 else [*body[:100], *body[-100:]]


def _is_tree(body: Sequence[str]) -> bool:
    sample = _sample(body)
    names = [_tree_item(line) for line in sample]
    if sum(1 for name in names if name is not None and _is_pathish(name)) < 0.9 * len(sample):
        return False
    glyphs = sum(1 for line in sample if _TREE_GLYPHS.match(line))
    dashes = sum(1 for line in sample if _DASH_ITEM.match(line))
    if max(glyphs, dashes) >= 0.7 * len(sample):
        return True
    # OpenCode ``list``: a root path ending in "/", then entries indented by two spaces a level.
    indented = sum(1 for line in sample[1:] if line.startswith("  "))
    return body[0].rstrip().endswith("/") and indented >= 0.9 * (len(sample) - 1)


def _tree_item(line: str) -> str | None:
    """The name on a tree line (after glyphs, a ``- `` or indentation)."""
    if glyph := _TREE_GLYPHS.match(line):
        return line[glyph.end() :].strip()
    if dash := _DASH_ITEM.match(line):
        return dash.group(2).strip()
    return line.strip() or None


def _is_pathish(line: str) -> bool:
    text = line.strip()
    if (
        not text
        or "\t" in text
        or "  " in text
        or text.endswith(":")
        or text[0] in "[(<#"
        or _SEARCH_HIT.search(text)
    ):
        return False
    if " " not in text:
        return True
    # A path with a space in it: its first part is a directory, and it reads like no sentence.
    return (
        "/" in text
        and " " not in text[: text.index("/")]
        and not any(mark in text for mark in _PROSE_MARKS)
    )


def _is_paths(body: Sequence[str], pathish: Sequence[bool]) -> bool:
    slashed = sum(1 for line in body if "/" in line.strip().rstrip("/"))
    return sum(pathish) >= 0.9 * len(body) and slashed >= 0.5 * len(body)


def _is_flat(body: Sequence[str]) -> bool:
    """One directory: ``ls -l`` lines, or bare names one per line or in columns."""
    if sum(1 for line in body if _LONG.match(line)) >= 0.8 * len(body):
        return True
    numbered = sum(1 for line in body if _NUMBERED_LINE.match(line) or _SIZE_PREFIX.match(line))
    if numbered >= 0.3 * len(body):
        return False  # a file view with line numbers, or sizes before the names
    return sum(1 for line in body if _is_name_line(line)) >= 0.9 * len(body)


# --- scoring ----------------------------------------------------------------------------------


def _extension(name: str) -> str:
    dot = name.rfind(".")
    return name[dot + 1 :].lower() if dot > 0 and "/" not in name[dot:] else ""


def _entry_score(name: str) -> float:
    base = name.rstrip("/")
    if name.endswith("/"):
        score = 1.5
    else:
        ext = _extension(name)
        score = (
            2.0 if ext in _SOURCE else 1.0 if ext in _CONFIG or not ext else -2.0 * (ext in _BINARY)
        )
    if base in _HEAVY_JUNK or base.endswith(".egg-info"):
        score -= 6.0
    elif base in _MILD_JUNK:
        score -= 2.0
    if base.startswith("."):
        score -= 1.0
    return score


def _dir_penalty(path: str) -> float:
    parts = set(path.rsplit("/", MAX_DEPTH)) - {"", ".", ".."}
    if parts & _HEAVY_JUNK or ".egg-info" in path:
        return HEAVY_PENALTY
    penalty = 4.0 if parts & _MILD_JUNK else 0.0
    if any(part[0] == "." for part in parts):
        penalty += 3.0
    return penalty


def _words(text: str) -> set[str]:
    return {word.lower() for word in _WORD.findall(text)}


def _score_groups(groups: Sequence[Group], root: str, focus: frozenset[str]) -> None:
    """Give every group its score (see the module docstring)."""
    kinds: dict[str, float] = {}  # extension -> +1 source, -1 binary, 0 other

    def kind(name: str) -> float:
        if name.endswith("/"):
            return 0.75
        ext = _extension(name)
        value = kinds.get(ext)
        if value is None:
            value = kinds[ext] = 1.0 if ext in _SOURCE else -1.0 if ext in _BINARY else 0.0
        return value

    word_sets = [
        _words(group.path.rstrip("/").rsplit("/", 1)[-1])
        | _words(" ".join(name for name in group.names if not name.endswith("/")))
        for group in groups
    ]
    frequency: dict[str, int] = {}
    for words in word_sets:
        for word in words:
            frequency[word] = frequency.get(word, 0) + 1
    scale = math.log(len(groups) + 1)
    for group, words in zip(groups, word_sets, strict=True):
        depth = group.path[len(root) :].count("/")
        names = group.names or [""]
        own = sum(math.log((len(groups) + 1) / frequency[word]) for word in sorted(words))
        penalty = _dir_penalty(group.path)
        group.junk = penalty >= HEAVY_PENALTY
        about_task = len(focus.intersection(name_parts(group.path[len(root) :]))) if focus else 0
        group.score = (
            FOCUS_BONUS * about_task
            - 1.0 * depth
            - penalty
            + 2.0 * sum(kind(name) for name in names) / len(names)
            + (3.0 * own / (len(words) * scale) if words else 0.0)
        )


def _common_root(paths: Iterable[str]) -> str:
    """The longest directory (ending in "/") that every one of ``paths`` lies in."""
    values = list(paths)
    if not values:
        return ""
    low, high = min(values), max(values)  # the common prefix of all is theirs
    size = 0
    for a, b in zip(low, high, strict=False):
        if a != b:
            break
        size += 1
    return low[: low.rfind("/", 0, size) + 1] if size < len(low) else low[: low.rfind("/") + 1]


# --- grouped listings -------------------------------------------------------------------------


def _path_groups(listing: Listing, pathish: Sequence[bool]) -> list[Group | int] | None:
    """Entries by directory, in order of first appearance; an int is a line kept as it is."""
    lines = listing.lines
    is_path = dict(zip(listing.body, pathish, strict=True))
    paths = {i: lines[i].strip() for i in listing.body}
    normal = {i: path.rstrip("/") or path for i, path in paths.items()}
    parents = {path.rsplit("/", 1)[0] for path in normal.values() if "/" in path}
    root = _common_root(path + ("/" if path in parents else "") for path in normal.values())
    items: list[Group | int] = []
    groups: dict[str, Group] = {}
    for index in listing.body:
        path = normal[index]
        if not is_path[index] or path + "/" == root or path in (".", "./"):
            items.append(index)  # the root itself, or a line that is not a path
            continue
        parent, _, name = path.rpartition("/")
        directory = parent + "/" if parent else "./"
        if path in parents or paths[index].endswith("/"):
            name += "/"
        group = groups.get(directory)
        if group is None:
            group = groups[directory] = Group(directory)
            items.append(group)
        group.names.append(name)
        group.lines.append(index)
    if not groups:
        return None
    _score_groups(list(groups.values()), root, listing.focus)
    return items


def _section_groups(listing: Listing) -> list[Group | int]:
    lines = listing.lines
    items: list[Group | int] = []
    group: Group | None = None
    body = set(listing.body)
    first, last = listing.body[0], listing.body[-1]
    for index in range(first, last + 1):
        line = lines[index].rstrip()
        if (index == first or not lines[index - 1].strip()) and _is_section_header(line):
            group = Group(line[:-1].rstrip("/") + "/", header=index)
            items.append(group)
            continue
        if group is None:
            if index in body:
                items.append(index)
            continue
        group.lines.append(index)  # blank separators too: the full tier shows them as they were
        if index in body and not re.match(r"total \d+$", line):
            group.names.extend(_names_of(line))
    groups = [item for item in items if isinstance(item, Group)]
    section_paths = {group.path for group in groups}
    for group in groups:
        group.names = [
            name + "/" if group.path + name + "/" in section_paths else name for name in group.names
        ]
    _score_groups(groups, _common_root(group.path for group in groups), listing.focus)
    return items


def _names_of(line: str) -> list[str]:
    """The entry names on one line of ``ls`` output: long format, columns or one name."""
    text = line.strip()
    if _LONG.match(text):
        fields = text.split(None, 8)
        return [fields[-1]] if len(fields) == 9 else [text]
    return [name for name in _COLUMN_GAP.split(text) if name]


def _grouped(
    listing: Listing, items: list[Group | int], max_chars: int, unit: str
) -> Compressed | None:
    groups = [item for item in items if isinstance(item, Group)]
    lines = listing.lines
    fixed = sum(len(lines[i]) + 1 for i in listing.head + listing.tail)
    fixed += sum(len(lines[item]) + 1 for item in items if isinstance(item, int))
    if fixed > max_chars // 2:
        return None  # mostly wrapper or lines that are not paths: not a clean listing
    available = max_chars - fixed
    _assign_tiers(groups, lines, available, listing.files_only)
    out = [lines[i] for i in listing.head]
    hidden_entries = hidden_groups = 0
    for item in items:
        if isinstance(item, Group) and item.tier == "gap":
            hidden_entries += len(item.names)
            hidden_groups += 1
            continue
        if hidden_groups:
            out.append(_gap(hidden_entries, hidden_groups, listing.files_only))
            hidden_entries = hidden_groups = 0
        if isinstance(item, int):
            out.append(lines[item])
        else:
            out.extend(_render_group(item, lines, listing.files_only))
    if hidden_groups:
        out.append(_gap(hidden_entries, hidden_groups, listing.files_only))
    out.extend(lines[i] for i in listing.tail)
    return Compressed("\n".join(out), _grouped_omitted(groups, unit))


def _grouped_omitted(groups: Sequence[Group], unit: str) -> str:
    total = sum(len(group.names) for group in groups)
    shown = sum(
        len(g.names) if g.tier == "full" else len(g.shown) if g.tier == "compact" else 0
        for g in groups
    )
    phrase = f"{total - shown} of {total} {unit} omitted" if shown < total else f"no {unit} omitted"
    if any(group.tier != "full" for group in groups):
        phrase += ", the rest shown grouped by directory" if shown < total else ", regrouped"
    return phrase


def _assign_tiers(groups: list[Group], lines: Sequence[str], available: int, files: bool) -> None:
    """Choose each group's tier, best groups first (see the module docstring)."""
    ranked = sorted(groups, key=lambda group: -group.score)
    spent = 0
    opening = GAP_COST // 2  # a shown group may split a gap in two: half a gap line, on average

    def full_cost(group: Group) -> int:
        indices = group.lines if group.header is None else [group.header, *group.lines]
        return sum(len(lines[i]) + 1 for i in indices)

    def counted_cost(group: Group) -> int:
        return len(_counted_line(group, files)) + 1

    def compact_cost(group: Group) -> int:
        return counted_cost(group) + 1 + sum(len(name) + 1 for name in group.names)

    # 1. The best groups, whole, while they fit in a first share of the budget (a group too big
    # for that share on its own is passed over; the first that no longer fits ends the pass).
    allowance = available * FULL_SHARE
    for group in ranked:
        cost = full_cost(group) + opening
        if cost > allowance:
            continue
        if spent + cost > allowance:
            break
        group.tier = "full"
        spent += cost
    # 2. A compact line for as many further groups as fit (part of the names for a huge one);
    # generated and cache directories get no more than a count line.
    for group in ranked:
        if group.tier != "gap" or group.junk:
            continue
        cost = compact_cost(group) + opening
        room = int(available * COMPACT_SHARE) - spent
        if cost <= room:
            group.tier, group.shown = "compact", list(range(len(group.names)))
            spent += cost
        elif cost > available * PARTIAL_SHARE and room > 200:
            share = min(room, int(available * PARTIAL_SHARE))
            group.tier = "compact"
            group.shown = _pick_names(group.names, share - counted_cost(group) - opening)
            spent += share
    # 3. A count line for further groups; 4. with what is left, names for counted groups and
    # then the original lines for compact ones.
    for group in ranked:
        cost = counted_cost(group) + opening
        if group.tier == "gap" and spent + cost <= available:
            group.tier = "counted"
            spent += cost
    for group in ranked:
        extra = compact_cost(group) - counted_cost(group)
        if group.tier == "counted" and not group.junk and spent + extra <= available:
            group.tier, group.shown = "compact", list(range(len(group.names)))
            spent += extra
    for group in ranked:
        if group.tier == "compact" and len(group.shown) == len(group.names):
            extra = full_cost(group) - compact_cost(group)
            if spent + extra <= available:
                group.tier = "full"
                spent += extra


def _pick_names(names: Sequence[str], room: int) -> list[int]:
    """The best-scoring names that fit in ``room`` characters, in their original order."""
    ranked = sorted(range(len(names)), key=lambda i: (-_entry_score(names[i]), i))
    chosen: list[int] = []
    spent = 0
    for index in ranked:
        cost = len(names[index]) + 1 + GAP_COST // 4
        if spent + cost <= room:
            chosen.append(index)
            spent += cost
    return sorted(chosen)


def _counts(count: int, files: bool) -> str:
    unit = "file" if files else "entry"
    if count == 1:
        return f"1 {unit}"
    return f"{count} files" if files else f"{count} entries"


def _counted_line(group: Group, files: bool) -> str:
    return f"{group.path} ({_counts(len(group.names), files)})"


def _render_group(group: Group, lines: Sequence[str], files: bool) -> list[str]:
    if group.tier == "full":
        indices = group.lines if group.header is None else [group.header, *group.lines]
        return [lines[i] for i in indices]
    if group.tier == "counted":
        return [_counted_line(group, files)]
    names = _with_gaps(group.names, group.shown, files)
    return [f"{_counted_line(group, files)}: {' '.join(names)}"]


def _gap_entries(count: int, files: bool) -> str:
    return gap_line(count, _counts(count, files).split(" ", 1)[1])


def _gap(entries: int, directories: int, files: bool) -> str:
    where = "1 directory" if directories == 1 else f"{directories} directories"
    what = _counts(entries, files).split(" ", 1)[1]
    return gap_line(entries, f"{what} in {where}")


# --- line-by-line listings --------------------------------------------------------------------


def _tree(listing: Listing, max_chars: int) -> Compressed | None:
    """The best-scoring tree lines, each with the directory lines above it."""
    lines = listing.lines
    parent, scores = _tree_structure(listing)
    kept: set[int] = set(listing.head) | set(listing.tail)
    spent = sum(len(lines[i]) + 1 for i in kept)
    body = listing.body
    for index in sorted(body, key=lambda i: (-scores[i], i)):
        wanted: list[int] = []
        cost = GAP_COST // 2
        above = index
        while above >= 0 and above not in kept and spent + cost <= max_chars:
            wanted.append(above)  # a kept line has the lines above it kept already
            cost += len(lines[above]) + 1
            above = parent[above]
        if spent + cost <= max_chars:
            kept.update(wanted)
            spent += cost
    shown = sum(1 for i in body if i in kept)
    if shown == len(body):
        return None
    out: list[str] = []
    run = 0
    body_set = set(body)
    for index in range(len(lines)):
        if index in kept:
            if run:
                out.append(_gap_entries(run, False))
                run = 0
            out.append(lines[index])
        elif index in body_set:
            run += 1
    if run:
        out.append(_gap_entries(run, False))
    return Compressed("\n".join(out), f"{len(body) - shown} of {len(body)} entries omitted")


def _tree_structure(listing: Listing) -> tuple[dict[int, int], dict[int, float]]:
    """Each tree line's parent line (-1 for a root) and its score."""
    lines = listing.lines
    depth_of: dict[int, int] = {}
    names: dict[int, str] = {}
    for index in listing.body:
        line = lines[index]
        if glyph := _TREE_GLYPHS.match(line):
            depth_of[index], names[index] = glyph.end() // 4 + 1, line[glyph.end() :]
        elif dash := _DASH_ITEM.match(line):
            depth_of[index], names[index] = len(dash.group(1)) // 2, dash.group(2)
        else:
            stripped = line.lstrip()
            depth_of[index], names[index] = (len(line) - len(stripped)) // 2, stripped
    parent: dict[int, int] = {}
    paths: dict[int, str] = {-1: ""}
    stack: list[int] = []  # the directory lines above the current one
    for index in listing.body:
        while stack and depth_of[stack[-1]] >= depth_of[index]:
            stack.pop()
        parent[index] = stack[-1] if stack else -1
        paths[index] = paths[parent[index]] + names[index].strip().rstrip("/") + "/"
        stack.append(index)
    directories = set(parent.values())
    for index in directories - {-1}:
        names[index] = names[index].strip().rstrip("/") + "/"
    groups: dict[int, Group] = {}
    for index in listing.body:
        up = parent[index]
        groups.setdefault(up, Group(paths[up])).names.append(names[index].strip())
    _score_groups(list(groups.values()), "", listing.focus)
    scores: dict[int, float] = {}
    for index in listing.body:
        if parent[index] < 0:
            scores[index] = math.inf  # a root line
            continue
        scores[index] = groups[parent[index]].score + _entry_score(names[index].strip())
        if index in directories:
            scores[index] += TREE_DIRECTORY_BONUS  # the shape of the tree comes first
    return parent, scores


def _flat(listing: Listing, max_chars: int) -> Compressed | None:
    """One directory's entries as names only, the best of them when not all fit."""
    lines = listing.lines
    names: list[str] = []
    for index in listing.body:
        line = lines[index].strip()
        if re.match(r"total \d+$", line):
            continue
        long = _LONG.match(line)
        for name in _names_of(line):
            names.append(name + "/" if long and line[0] == "d" else name)
    fixed = sum(len(lines[i]) + 1 for i in listing.head + listing.tail)
    label = f"{_counts(len(names), listing.files_only)}:"
    room = max_chars - fixed - len(label)
    if sum(len(name) + 1 for name in names) <= room:
        shown = list(range(len(names)))
    else:
        shown = _pick_names(names, room)
    words = [label, *_with_gaps(names, shown, listing.files_only)]
    out = [lines[i] for i in listing.head]
    out.extend(_wrap(words, FLAT_WIDTH))
    out.extend(lines[i] for i in listing.tail)
    hidden = len(names) - len(shown)
    if hidden:
        omitted = f"{hidden} of {len(names)} entries omitted, the rest shown by name only"
    else:
        omitted = f"details of all {len(names)} entries omitted, names kept"
    return Compressed("\n".join(out), omitted)


def _with_gaps(names: Sequence[str], shown: Sequence[int], files: bool) -> list[str]:
    """The shown names in order, with a gap marker wherever names were left out."""
    return with_gaps(names, shown, lambda count: _gap_entries(count, files))


def _wrap(words: Sequence[str], width: int) -> list[str]:
    out: list[str] = []
    line = ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    return out
