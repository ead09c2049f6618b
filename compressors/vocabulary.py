"""The one tool vocabulary: which tool names mean a shell, an editor or a subagent, and what a
shell call runs (its command line, the program it mostly runs).

Names are compared lower-cased (``ToolOutput.tool_key``). The compressors' registry, the file
view recogniser and the checkpoint extractor all read them here.
"""

from __future__ import annotations

import re
import shlex

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


_SKIP_WORDS = frozenset({"sudo", "time", "env", "nohup", "timeout", "command", "exec", "xargs"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def shell_program(command: str) -> str:
    """The program a shell command line mostly runs: the first word of its last ``&&`` step,
    skipping ``cd``, env assignments and wrappers (``sudo``, ``timeout 30``)."""
    steps = [step for step in re.split(r"&&|;|\n", command) if step.strip()]
    for step in reversed(steps):
        first_stage = step.split("|", 1)[0]
        try:
            words = shlex.split(first_stage, comments=True)
        except ValueError:
            words = first_stage.split()
        words = [w for w in words if not _ASSIGNMENT.match(w)]
        while words and (words[0] in _SKIP_WORDS or words[0].isdigit()):
            words = words[1:]
            if words and words[0].startswith("-"):
                words = words[1:]
        if not words or words[0] == "cd":
            continue
        program = words[0].rsplit("/", 1)[-1]
        if program in ("python", "python3") and len(words) > 2 and words[1] == "-m":
            return words[2]
        if program == "git" and len(words) > 1 and words[1] == "grep":
            return "git-grep"
        return program
    return ""
