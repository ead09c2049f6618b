"""The one visible list of per-tool compressors, and how a tool output finds its compressor.

Order of choice: the tool's name or alias; for shell tools, the program the command runs; for
editor tools, the editor command; then the shape of the output; then the generic fallback.
A compressor that returns None passes the output on to the next candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from compressors.outputs import Budget, Compressed, CompressFn, RecogniseFn, ToolOutput
from compressors.tools import diff, file_read, generic, json_crush, listing, prose, search, shell
from compressors.vocabulary import (
    EDITOR_TOOLS,
    SHELL_TOOLS,
    SUBAGENT_TOOLS,
    command_text,
    shell_program,
)


@dataclass(frozen=True, slots=True)
class ToolCompressor:
    name: str
    compress: CompressFn
    # Cheaply, before compressing: whether the output has this kind's shape. ``compress``
    # returns None for an output it does not recognise (and may for one it does).
    recognises: RecogniseFn
    tools: frozenset[str]  # lowercased tool names and aliases that mean this kind
    programs: frozenset[str] = frozenset()  # shell programs whose output is this kind


FILE_READ = ToolCompressor(
    "file_read",
    file_read.compress,
    file_read.recognises,
    frozenset(
        {
            "read",
            "read_file",
            "view",
            "view_file",
            "open",
            "open_file",
            "goto",
            "scroll_up",
            "scroll_down",
            "cat",
        }
    ),
    frozenset(
        {
            "cat",
            "nl",
            "head",
            "tail",
            "sed",
            "open",
            "goto",
            "scroll_up",
            "scroll_down",
            "bat",
            "less",
            "more",
        }
    ),
)
LISTING = ToolCompressor(
    "listing",
    listing.compress,
    listing.recognises,
    frozenset(
        {
            "glob",
            "list",
            "ls",
            "list_files",
            "list_dir",
            "list_directory",
            "find_file",
            "find_files",
            "tree",
        }
    ),
    frozenset({"find", "ls", "tree", "fd", "fdfind", "find_file", "locate", "du"}),
)
SEARCH = ToolCompressor(
    "search",
    search.compress,
    search.recognises,
    frozenset(
        {
            "grep",
            "search",
            "search_dir",
            "search_file",
            "rg",
            "ripgrep",
            "grep_search",
            "codebase_search",
            "code_search",
        }
    ),
    frozenset(
        {"grep", "egrep", "fgrep", "rg", "ag", "ack", "git-grep", "search_dir", "search_file"}
    ),
)
SHELL = ToolCompressor("shell", shell.compress, shell.recognises, SHELL_TOOLS)
JSON = ToolCompressor("json", json_crush.compress, json_crush.recognises, frozenset())
DIFF = ToolCompressor("diff", diff.compress, diff.recognises, frozenset({"diff", "git_diff"}))
PROSE = ToolCompressor(
    "prose",
    prose.compress,
    prose.recognises,
    frozenset(
        {
            "task",
            "agent",
            "subagent",
            "webfetch",
            "web_fetch",
            "fetch",
            "websearch",
            "web_search",
            "browser",
            "browse",
        }
    ),
)
GENERIC = ToolCompressor("generic", generic.compress, generic.recognises, frozenset())

# The list. Shape detection tries these in this order when the name says nothing.
COMPRESSORS: tuple[ToolCompressor, ...] = (
    JSON,
    DIFF,
    FILE_READ,
    SEARCH,
    LISTING,
    SHELL,
    PROSE,
    GENERIC,
)

# Results of these tools are never compressed: they confirm an edit, carry a plan or a
# question, or are deepmem's own answers.
DEFAULT_PROTECTED_TOOLS: frozenset[str] = frozenset(
    {
        "edit",
        "write",
        "patch",
        "multiedit",
        "apply_patch",
        "todowrite",
        "todoread",
        "question",
        "skill",
        "deep_expand",
        "memory_search",
        "memory_store",
        "memory_forget",
    }
)
_OWN_TOOL = re.compile(r"(?:^|[_.-])(deep_expand|memory_search|memory_store|memory_forget)$")


def is_protected(output: ToolOutput, protected: frozenset[str]) -> bool:
    key = output.tool_key
    return key in protected or bool(_OWN_TOOL.search(key))


def is_subagent_report(output: ToolOutput) -> bool:
    return output.tool_key in SUBAGENT_TOOLS


# Which compressor a shell program's output goes to first: from each entry's ``programs``.
BY_PROGRAM: dict[str, ToolCompressor] = {
    program: compressor for compressor in COMPRESSORS for program in compressor.programs
}


def candidates(output: ToolOutput) -> list[ToolCompressor]:
    """Compressors to try, most specific first; GENERIC always last."""
    key = output.tool_key
    first: list[ToolCompressor] = []
    if key in EDITOR_TOOLS:
        first.append(FILE_READ)
    elif key in SHELL.tools:
        command = command_text(output.arguments)
        by_program = BY_PROGRAM.get(shell_program(command)) if command else None
        if by_program is not None:
            first.append(by_program)
        # `curl`/`gh api` print JSON, `git show` a diff: their own shape wins over "a log"
        first += [JSON, DIFF, SHELL]
    else:
        for compressor in COMPRESSORS:
            if key in compressor.tools:
                first.append(compressor)
                break
    rest = [c for c in COMPRESSORS if c not in first and c is not GENERIC]
    return [*first, *rest, GENERIC]


def compress_output(output: ToolOutput, budget: Budget) -> tuple[str, Compressed] | None:
    """The first candidate's result that fits; (compressor name, result) or None."""
    for compressor in candidates(output):
        result = compressor.compress(output, budget)
        if result is not None:
            return compressor.name, result
    return None


def compress_on_arrival(
    output: ToolOutput, budget: Budget, kinds: frozenset[str]
) -> tuple[str, Compressed] | None:
    """``compress_output`` for an output that has just arrived, of the ``kinds`` compressed
    then, or None. Its kind is the first candidate's that recognises its shape: another
    kind's compression can wait for the request after it, so it is not computed here."""
    for compressor in candidates(output):
        if compressor.name not in kinds:
            if compressor.recognises(output, budget):
                return None
            continue
        result = compressor.compress(output, budget)
        if result is not None:
            return compressor.name, result
    return None
