"""The one tool vocabulary: which tool names mean a shell, an editor or a subagent, and what a
shell call runs (its command line, its simple commands, the program it mostly runs).

Names are compared lower-cased (``ToolOutput.tool_key``). The compressors' registry, the file
view recogniser and the checkpoint extractor all read them here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from compressors.outputs import CallArguments

SHELL_TOOLS: frozenset[str] = frozenset(
    {
        "bash",
        "execute_bash",
        "shell",
        "run",
        "run_command",
        "terminal",
        "exec",
        "execute_command",
        "command",
        "run_terminal_cmd",
        "powershell",
        "sh",
        "shell_command",  # Codex CLI
        "exec_command",
        "local_shell",
        "container.exec",
        "run_shell_command",  # Gemini CLI
    }
)
# Editors with a ``command`` argument (view, create, str_replace, insert, undo_edit).
EDITOR_TOOLS: frozenset[str] = frozenset(
    {"str_replace_editor", "str_replace_based_edit_tool", "editor", "text_editor"}
)
# A subagent's report is what it concluded, written for this agent to act on.
SUBAGENT_TOOLS: frozenset[str] = frozenset(
    {"task", "agent", "subagent", "spawn_agent", "dispatch_agent", "delegate"}
)


def command_text(arguments: str) -> str:
    """The command line of a shell call; Codex may send it as an argv list
    (``["bash", "-lc", "sed -n 1,80p a.py"]``): the script is its last word."""
    parsed = CallArguments(arguments)
    text = parsed.text("command", "cmd", "script", "input")
    if text:
        return text
    for name in ("command", "cmd"):
        value = parsed.parsed.get(name)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            words = [str(v) for v in value]
            script = len(words) >= 3 and words[-2] in ("-c", "-lc")
            return words[-1] if script else shlex.join(words)
    return ""


# Words that run the command after them: the program is the next word.
_WRAPPERS: frozenset[str] = frozenset(
    {"sudo", "time", "env", "nohup", "timeout", "command", "exec", "xargs"}
)
# Reserved words that may open a command (``if grep -q x f; then rm f; fi``).
_RESERVED = frozenset(
    {"!", "{", "}", "if", "then", "elif", "else", "fi", "do", "done", "while", "until"}
)
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?[smhd]?$")  # a wrapper's count or duration: timeout 30s
_OPERATORS = ("&&", "||", ";;", ";", "|&", "|", "&", "\n")
_WRITES = (">>", ">|", ">", "&>>", "&>")  # output redirections, longest first
_REDIRECTIONS = ("<<<", "<<-", "<<", "<>", "<&", ">&", *_WRITES, "<")
_PLAIN = re.compile(r"[^\s;&|()<>'\"\\`$]+")  # a run of a word with nothing to interpret
_PLAIN_QUOTED = re.compile(r'[^"\\$]+')


@dataclass(frozen=True, slots=True)
class ShellStep:
    """One simple command of a command line."""

    words: tuple[str, ...]  # from the program on (wrappers, assignments skipped), unquoted
    writes: tuple[str, ...] = ()  # targets of its output redirections (``> f``, ``2>> f``)
    after: str = ""  # the operator before it: "", "&&", "||", ";", "|", "&" or a newline


def shell_steps(command: str) -> list[ShellStep]:
    """The simple commands of a shell command line, in order.

    Splits on ``&& || ; | &`` and newlines outside quotes, ``$(…)`` and backticks; ``(`` and
    ``)`` group without being words; comments and heredoc bodies are skipped; redirections are
    taken out of the words (output targets kept as ``writes``). Lenient: an unclosed quote
    runs to the end. Not a shell: no expansion, no aliases, no functions.
    """
    return _ShellLexer(command).steps()


class _ShellLexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0
        self.found: list[ShellStep] = []
        self.words: list[str] = []
        self.writes: list[str] = []
        self.after = ""
        self.heredocs: list[tuple[str, bool]] = []  # (delimiter, strip leading tabs)

    def steps(self) -> list[ShellStep]:
        text = self.text
        while self.at < len(text):
            char = text[self.at]
            if char in " \t\r":
                self.at += 1
            elif char == "#":
                newline = text.find("\n", self.at)
                self.at = len(text) if newline < 0 else newline
            elif char == "\\" and text.startswith("\\\n", self.at):
                self.at += 2
            elif char in "()":
                self.end_step("")  # the group's first command follows what preceded it
                self.at += 1
            elif char in "<>&0123456789" and self.redirection():
                continue
            elif char in "&|;\n" and (
                operator := next(op for op in _OPERATORS if text.startswith(op, self.at))
            ):
                self.at += len(operator)
                self.end_step(operator)
                if operator == "\n":
                    self.skip_heredocs()
            else:
                self.words.append(self.word())
        self.end_step("")
        return self.found

    def end_step(self, operator: str) -> None:
        words = self.words
        skip = 0
        while skip < len(words):
            word = words[skip]
            if word in _WRAPPERS or word in _RESERVED or _ASSIGNMENT.match(word):
                skip += 1
                wrapped = word in _WRAPPERS
                while wrapped and skip < len(words) and _is_wrapper_option(words[skip]):
                    skip += 1
            else:
                break
        if words[skip:] or self.writes:
            self.found.append(ShellStep(tuple(words[skip:]), tuple(self.writes), self.after))
        self.words, self.writes = [], []
        if operator:
            self.after = operator

    def redirection(self) -> bool:
        """Read a redirection at the cursor (an fd number before it included); False if none."""
        text, start = self.text, self.at
        digits = start
        while digits < len(text) and text[digits].isdigit():
            digits += 1
        at = digits
        operator = next((op for op in _REDIRECTIONS if text.startswith(op, at)), "")
        if not operator or (digits > start and operator.startswith("&")):
            return False
        if text.startswith("(", at + len(operator)) and operator in ("<", ">"):
            return False  # a process substitution: a word
        self.at = at + len(operator)
        while self.at < len(text) and text[self.at] in " \t":
            self.at += 1
        target = self.word() if self.at < len(text) and not self.at_boundary() else ""
        if operator in ("<<", "<<-"):
            self.heredocs.append((target, operator == "<<-"))
        elif target and (operator in _WRITES or (operator == ">&" and not _is_fd(target))):
            self.writes.append(target)
        return True

    def at_boundary(self) -> bool:
        return self.text[self.at] in "\n;&|()<>"

    def word(self) -> str:
        """One word from the cursor, quotes removed, ``$(…)`` and backticks kept whole."""
        text = self.text
        out: list[str] = []
        while self.at < len(text):
            if plain := _PLAIN.match(text, self.at):
                out.append(plain[0])
                self.at = plain.end()
                continue
            char = text[self.at]
            if char in "<>" and not out and text.startswith("(", self.at + 1):
                out.append(char + self.balanced(self.at + 1))  # a process substitution
                continue
            if char == "(" and out and out[-1].endswith("="):
                out.append(self.balanced(self.at))  # an array: a=(1 2)
                continue
            if char in " \t\r\n;&|()<>":
                break
            if char == "'":
                close = text.find("'", self.at + 1)
                close = len(text) if close < 0 else close
                out.append(text[self.at + 1 : close])
                self.at = close + 1
            elif char == '"':
                out.append(self.double_quoted())
            elif char == "\\":
                following = text[self.at + 1 : self.at + 2]
                out.append("" if following == "\n" else following)  # a line continues
                self.at += 2
            elif char == "$" and text.startswith("(", self.at + 1):
                out.append("$" + self.balanced(self.at + 1))
            elif char == "`":
                close = text.find("`", self.at + 1)
                close = len(text) if close < 0 else close
                out.append(text[self.at : close + 1])
                self.at = close + 1
            else:
                out.append(char)
                self.at += 1
        return "".join(out)

    def double_quoted(self) -> str:
        text = self.text
        out: list[str] = []
        self.at += 1
        while self.at < len(text) and text[self.at] != '"':
            if plain := _PLAIN_QUOTED.match(text, self.at):
                out.append(plain[0])
                self.at = plain.end()
                continue
            char = text[self.at]
            if char == "\\" and self.at + 1 < len(text):
                following = text[self.at + 1]
                out.append(following if following in '"\\$`' else char + following)
                self.at += 2
            elif char == "$" and text.startswith("(", self.at + 1):
                out.append("$" + self.balanced(self.at + 1))
            else:
                out.append(char)
                self.at += 1
        self.at += 1
        return "".join(out)

    def balanced(self, opening: int) -> str:
        """The text from the ``(`` at ``opening`` to its match, quotes inside respected."""
        text, depth, at = self.text, 0, opening
        while at < len(text):
            char = text[at]
            if char == "(":
                depth += 1
            elif char == ")":
                depth -= 1
                if depth == 0:
                    break
            elif char in "'\"":
                close = text.find(char, at + 1)
                at = len(text) if close < 0 else close
            elif char == "\\":
                at += 1
            at += 1
        self.at = min(at + 1, len(text))
        return text[opening : self.at]

    def skip_heredocs(self) -> None:
        """Skip the bodies of the heredocs opened on the line just ended."""
        lines = self.text[self.at :].split("\n")
        skipped = 0
        for delimiter, strip_tabs in self.heredocs:
            while skipped < len(lines):
                line = lines[skipped]
                skipped += 1
                if (line.lstrip("\t") if strip_tabs else line).strip() == delimiter:
                    break
        self.heredocs = []
        self.at = min(len(self.text), self.at + sum(len(line) + 1 for line in lines[:skipped]))


def _is_wrapper_option(word: str) -> bool:
    return word.startswith("-") or bool(_NUMBER.match(word)) or bool(_ASSIGNMENT.match(word))


def _is_fd(word: str) -> bool:
    return word.isdigit() or word == "-"


def shell_program(command: str) -> str:
    """The program a shell command line mostly runs: the first word of its last step (of
    those joined by ``&&``, ``;`` or a newline: ``pytest || true`` runs pytest), skipping
    ``cd``, env assignments and wrappers (``sudo``, ``timeout 30``)."""
    for step in reversed(shell_steps(command)):
        if step.after in ("|", "||", "|&", "&") or not step.words or step.words[0] == "cd":
            continue
        words = step.words
        program = words[0].rsplit("/", 1)[-1]
        if program in ("python", "python3") and len(words) > 2 and words[1] == "-m":
            return words[2]
        if program == "git" and len(words) > 1 and words[1] == "grep":
            return "git-grep"
        return program
    return ""
