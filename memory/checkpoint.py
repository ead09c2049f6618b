"""Compaction checkpoints: what a session was about, extracted without a model.

When OpenCode compacts a session, deepmem writes ``.deep-memory/checkpoint.md``: the user's
intents, the decisions and constraints stated in the conversation, gotchas (an error and the
edit that fixed it), the files changed and the files read most. ``extract`` reads them from a
parsed request of any of the three wire formats; ``extract_transcript`` from the text
transcript inside OpenCode's compaction request, for sessions whose messages the proxy never
saw. Everything is plain patterns in English and Chinese: same input, same checkpoint.
``essentials`` turns a checkpoint into a short digest for resuming within a token budget.
"""

from __future__ import annotations

import posixpath
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from compressors import jsontext
from compressors.tokens import estimate_tokens
from compressors.transcript_grammar import Label, blocks, conversation_span, tool_call
from compressors.view import Conversation, Dialect, Kind, Role
from compressors.vocabulary import EDITOR_TOOLS, SHELL_TOOLS, command_text, shell_steps
from compressors.wire import parse_conversation
from memory.signals import SIGNAL_PATTERNS
from memory.store import normalize

MAX_ITEMS = 20
MAX_FILES_READ = 10
INTENT_CHARS = 300
SENTENCE_CHARS = 240
ERROR_CHARS = 200
COMMAND_CHARS = 120
FIX_WINDOW = 3  # tool calls after an error in which an edit counts as its fix
NONE = "(none)"
TIMES = "\u00d7"  # the multiplication sign, as in "path (3 times)"

SECTIONS: tuple[tuple[str, str], ...] = (
    ("User Intent", "intents"),
    ("Decisions", "decisions"),
    ("Constraints", "constraints"),
    ("Gotchas", "gotchas"),
    ("File Changes", "file_changes"),
    ("Files Read", "files_read"),
)


# ---------------------------------------------------------------- the checkpoint


@dataclass
class Checkpoint:
    """What one compaction kept of a session; ``render`` / ``parse`` are its Markdown form."""

    session_id: str
    captured_at: datetime
    message_count: int
    intents: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)
    gotchas: list[str] = field(default_factory=list)
    file_changes: list[str] = field(default_factory=list)
    files_read: list[tuple[str, int]] = field(default_factory=list)  # (path, times), most first
    archive: str | None = None  # where the raw history is archived

    def __post_init__(self) -> None:
        self.captured_at = _utc(self.captured_at)

    def render(self) -> str:
        header = f"Captured {self.captured_at.isoformat()}, {self.message_count} messages"
        if self.archive:
            header += f", full history: {_one_line(self.archive)}"
        lines = [f"# Checkpoint — {_one_line(self.session_id)}", header]
        for title, name in SECTIONS:
            if name == "files_read":
                items = [f"{_one_line(path)} ({count}{TIMES})" for path, count in self.files_read]
            else:
                items = [_one_line(text) for text in getattr(self, name)]
            lines += ["", f"## {title}", ""]
            lines += [f"- {item}" for item in items if item] or [f"- {NONE}"]
        return "\n".join(lines) + "\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """Read a rendered checkpoint back; raise ``ValueError`` if ``text`` is not one."""
        lines = text.replace("\r\n", "\n").split("\n")
        title = _TITLE.match(lines[0]) if lines else None
        captured = _CAPTURED.match(lines[1]) if len(lines) > 1 else None
        if title is None or captured is None:
            raise ValueError("not a rendered checkpoint")
        names = dict(SECTIONS)
        found: dict[str, list[str]] = {name: [] for _, name in SECTIONS}
        current: list[str] | None = None
        for line in lines[2:]:
            if line.startswith("## "):
                name = names.get(line[3:].strip())
                current = found[name] if name else None
            elif current is not None and line.startswith("- ") and line[2:].strip() != NONE:
                current.append(line[2:].strip())
        files_read: list[tuple[str, int]] = []
        for item in found.pop("files_read"):
            match = _READ_COUNT.match(item)
            files_read.append((match[1], int(match[2])) if match else (item, 1))
        return cls(
            session_id=title[1].strip(),
            captured_at=datetime.fromisoformat(captured[1]),
            message_count=int(captured[2]),
            files_read=files_read,
            archive=captured[3],
            **found,
        )


_TITLE = re.compile(r"^# Checkpoint — (.*)$")
_CAPTURED = re.compile(r"^Captured (\S+), (\d+) messages?(?:, full history: (.+))?$")
_READ_COUNT = re.compile(rf"^(.*) \((\d+){TIMES}\)$")


def essentials(checkpoint: Checkpoint, budget_tokens: int) -> str:
    """A plain-text digest for resuming the session that fits ``budget_tokens``.

    Order of priority: intents (latest first), constraints, decisions, gotchas, file changes,
    files read. Lines are added in that order until the next one does not fit; that one is
    shortened to the space left when enough is left, and the digest ends there.
    """
    head = (
        f"Resuming session {_one_line(checkpoint.session_id)} "
        f"(checkpoint {checkpoint.captured_at.isoformat()}, {checkpoint.message_count} messages)."
    )
    if checkpoint.archive:
        head += f" Full history: {_one_line(checkpoint.archive)}"
    groups = (
        ("User intent, latest first", list(reversed(checkpoint.intents))),
        ("Constraints", checkpoint.constraints),
        ("Decisions", checkpoint.decisions),
        ("Gotchas", checkpoint.gotchas),
        ("File changes", checkpoint.file_changes),
        ("Files read", [f"{path} ({count}{TIMES})" for path, count in checkpoint.files_read]),
    )
    out: list[str] = []
    if not _fits([head], budget_tokens):
        return ""
    out.append(head)
    for title, items in groups:
        started = False
        for item in items:
            lead = [] if started else [f"{title}:"]
            line = f"- {_one_line(item)}"
            if _fits([*out, *lead, line], budget_tokens):
                out += [*lead, line]
                started = True
                continue
            shortened = _shorten_to_fit([*out, *lead], line, budget_tokens)
            if shortened is not None:
                out += [*lead, shortened]
            return "\n".join(out)
    return "\n".join(out)


def _fits(lines: list[str], budget_tokens: int) -> bool:
    return estimate_tokens("\n".join(lines)) <= budget_tokens


def _shorten_to_fit(before: list[str], line: str, budget_tokens: int) -> str | None:
    """``line`` cut (with an ellipsis) to the space left after ``before``; None if too little."""
    low, high, best = 24, len(line) - 1, None
    while low <= high:
        middle = (low + high) // 2
        candidate = line[:middle].rstrip() + "…"
        if _fits([*before, candidate], budget_tokens):
            best, low = candidate, middle + 1
        else:
            high = middle - 1
    return best


# ---------------------------------------------------------------- extraction


def extract(conversation: Conversation, session_id: str, captured_at: datetime) -> Checkpoint:
    """The checkpoint of a parsed request view (OpenAI chat, Anthropic or Responses)."""
    statements = _statements(conversation)
    steps = _steps(conversation)
    activity = _FileActivity(steps)
    gotchas = _gotchas(steps, activity.actions) + statements["fix"]
    return Checkpoint(
        session_id=session_id,
        captured_at=captured_at,
        message_count=_message_count(conversation),
        intents=_intents(conversation.user_messages()),
        decisions=_limit(statements["decision"]),
        constraints=_limit(statements["constraint"]),
        gotchas=_limit(gotchas),
        file_changes=activity.changes(),
        files_read=activity.most_read(),
    )


def extract_transcript(text: str, session_id: str, captured_at: datetime) -> Checkpoint:
    """The checkpoint of OpenCode's compaction transcript (``[User]: …`` lines).

    The transcript is turned back into an OpenAI chat body (one assistant message per run of
    reasoning, text and tool calls; each result answers the oldest unanswered call) and read
    with ``extract``.
    """
    body = {"messages": transcript_messages(text)}
    return extract(parse_conversation(Dialect.OPENAI_CHAT, body), session_id, captured_at)


def transcript_messages(text: str) -> list[dict[str, Any]]:
    """OpenAI chat messages rebuilt from a ``<conversation>`` transcript (or from ``text``
    read whole as one, when it has no ``<conversation>`` block)."""
    body_start, body_end = conversation_span(text) or (0, len(text))
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None
    waiting: list[str] = []
    for block in blocks(text[body_start:body_end]):
        label, content = block.label, block.text.strip("\n")
        if label is Label.USER:
            assistant = None
            messages.append({"role": "user", "content": content})
        elif label in (Label.TOOL_RESULT, Label.TOOL_ERROR):
            assistant = None
            if label is Label.TOOL_ERROR and not _TOOL_FAILURE.search(content):
                content = f"Error: {content}"
            call_id = waiting.pop(0) if waiting else f"call_{len(messages)}_orphan"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        else:
            if assistant is None:
                assistant = {"role": "assistant", "content": ""}
                messages.append(assistant)
            if label is Label.ASSISTANT:
                assistant["content"] = "\n".join(filter(None, [assistant["content"], content]))
            elif label is Label.REASONING:
                previous = assistant.get("reasoning_content", "")
                assistant["reasoning_content"] = "\n".join(filter(None, [previous, content]))
            else:
                name, arguments = tool_call(content)
                call_id = f"call_{len(messages)}_{len(assistant.get('tool_calls', []))}"
                waiting.append(call_id)
                function = {"name": name, "arguments": arguments}
                call: dict[str, Any] = {"id": call_id, "type": "function", "function": function}
                assistant.setdefault("tool_calls", []).append(call)
    return messages


def _message_count(conversation: Conversation) -> int:
    return conversation.wire.message_count(conversation.body)


# -- intents

_INJECTED = re.compile(
    r"<(deep-memory-context|system-reminder)\b[^>]*>.*?(?:</\1\s*>|\Z)", re.DOTALL | re.IGNORECASE
)
_NOT_INTENTS = ("what did we do so far", "continue if you have next steps")


def _intents(user_messages: list[tuple[int, str]]) -> list[str]:
    found: list[tuple[int, str]] = []
    for position, text in user_messages:
        line = _one_line(_INJECTED.sub(" ", text), INTENT_CHARS)
        if line and not normalize(line).startswith(_NOT_INTENTS):
            found.append((position, line))
    unique = [text for _, text in _unique(found)]
    if len(unique) <= MAX_ITEMS:
        return unique
    # The first request names the task; the latest say where it stands now.
    return [unique[0], *unique[-(MAX_ITEMS - 1) :]]


# -- decisions, constraints, stated fixes

_SIGNAL = {kind: pattern for kind, _section, pattern in SIGNAL_PATTERNS}
_MORE_DECISIONS = re.compile(
    r"\b(?:decided\s+(?:to|on|that)|opted\s+(?:for|to)|chose\s+to|going\s+with|"
    r"(?:use|using|switch(?:ed|ing)?\s+to|go\s+with)\b[^.;\n]{1,60}\b(?:instead\s+of|rather\s+than))\b"
    r"|方案[是为]|选用|换成|统一用|确定用|最终用",
    re.IGNORECASE,
)
# Rules a user states: "always …", "never …", "you must …", "不要…", "必须…".
_USER_RULES = re.compile(
    r"^(?:please\s+)?(?:always|never|don'?t|do\s+not|make\s+sure|avoid|only\s+use)\b"
    r"|\bmust(?:\s+not|\s+never)?\s+(?!be\s+(?:a|an|the|due|caused|because)\b|have\b)"
    r"|\bshould\s+(?:always|never)\b|\b(?:is|are)\s+(?:not\s+allowed|required|forbidden)\b"
    r"|不要|必须|务必|禁止|不允许|不准|不得|千万别|一定要|只能|永远不要|严禁|别用|不能用",
    re.IGNORECASE,
)
# "Let's use find_file to see where it is": an agent narrating its next tool call.
_NARRATION = re.compile(
    r"\b(?:command|tool)\b|\bto\s+(?:see|find|look|check|view|list|search|open|locate|inspect|"
    r"navigate|get\s+an?\s+idea|confirm|verify|reproduce)\b",
    re.IGNORECASE,
)
_NARRATED_DECISION = re.compile(r"\b(?:let'?s|we'?ll|we\s+will)\s", re.IGNORECASE)
# "The fix is straightforward" says nothing; a fix worth keeping names something.
_CONCRETE = re.compile(r"`[^`]+`|\w[./_]\w|\w\(\)|[A-Z][a-z]+[A-Z]|[\u4e00-\u9fff]{8,}")
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])|\n+")
_LIST_MARK = re.compile(r"^(?:[-*+>]|#{1,6}|\d{1,3}[.)])\s+")
_CODE_CHARS = re.compile(r"[{}()\[\];=<>$\\]")


def _statements(conversation: Conversation) -> dict[str, list[tuple[int, str]]]:
    """Sentences of user and assistant prose by kind: decision, constraint, fix."""
    found: dict[str, list[tuple[int, str]]] = {"decision": [], "constraint": [], "fix": []}
    for position, item in enumerate(conversation.items):
        if item.kind is not Kind.TEXT or item.role not in (Role.USER, Role.ASSISTANT):
            continue
        from_user = item.role is Role.USER
        prose = _FENCED.sub("\n", _INJECTED.sub("\n", item.text))
        for sentence in _sentences(prose):
            kind = classify(sentence, from_user)
            if kind is not None:
                found[kind].append((position, _one_line(sentence, SENTENCE_CHARS)))
    return {kind: _unique(items) for kind, items in found.items()}


def classify(sentence: str, from_user: bool = True) -> str | None:
    """``"constraint"``, ``"decision"``, ``"fix"`` or None for one sentence of prose.

    Rules a user states ("always …", "不要…") are constraints only in the user's own words.
    """
    if (from_user and _USER_RULES.search(sentence)) or _SIGNAL["constraint"].search(sentence):
        return "constraint"
    match = _SIGNAL["decision"].search(sentence) or _MORE_DECISIONS.search(sentence)
    if match is not None and not (
        _NARRATED_DECISION.match(sentence, match.start()) and _NARRATION.search(sentence)
    ):
        return "decision"
    if _SIGNAL["fix"].search(sentence) and _CONCRETE.search(sentence):
        return "fix"
    return None


def _sentences(text: str) -> Iterator[str]:
    for piece in _SENTENCE_BREAK.split(text):
        sentence = _LIST_MARK.sub("", piece.strip()).strip()
        if len(sentence) < 4 or len(sentence) > 4 * SENTENCE_CHARS:
            continue
        if len(_CODE_CHARS.findall(sentence)) > max(4, len(sentence) // 12):
            continue
        yield sentence


# -- tool calls


@dataclass
class _Step:
    """One tool call, its arguments and the text of its result."""

    position: int
    name: str
    args: dict[str, Any]
    raw_args: str
    result: str = ""
    answered: bool = False


def _steps(conversation: Conversation) -> list[_Step]:
    steps: list[_Step] = []
    by_id: dict[str, _Step] = {}
    for position, item in enumerate(conversation.items):
        if item.kind is Kind.TOOL_CALL:
            args, raw = _arguments(item.value)
            step = _Step(position, _tool_name(item.tool_name), args, raw)
            steps.append(step)
            if item.call_id:
                by_id[item.call_id] = step
        elif item.kind is Kind.TOOL_RESULT:
            answered = by_id.get(item.call_id or "")
            if answered is None:
                answered = next((s for s in steps if not s.answered), None)
            if answered is not None:
                answered.result = (
                    f"{answered.result}\n{item.text}" if answered.answered else item.text
                )
                answered.answered = True
    return steps


def _arguments(value: object) -> tuple[dict[str, Any], str]:
    if isinstance(value, dict):
        return value, jsontext.dumps(value).decode()
    raw = value if isinstance(value, str) else ""
    try:
        parsed = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        parsed = {}
    return (parsed if isinstance(parsed, dict) else {}), raw


def _tool_name(name: str | None) -> str:
    """Lower case, without a namespace (``functions.read``, ``mcp__fs__read_file``)."""
    base = (name or "").strip().lower().rsplit(".", 1)[-1]
    return base.rsplit("__", 1)[-1]


_READ_TOOLS = {"read", "read_file", "readfile", "view", "view_file", "open", "open_file", "cat"}
_WRITE_TOOLS = {"write", "write_file", "writefile"}
_CREATE_TOOLS = {"create", "create_file"}
_EDIT_TOOLS = {
    "edit",
    "multiedit",
    "edit_file",
    "str_replace",
    "replace",
    "insert",
    "notebookedit",
    "search_replace",
    "replace_in_file",
}
_PATCH_TOOLS = {"patch", "apply_patch", "applypatch"}
_EDITOR_COMMANDS = {"create": "created", "str_replace": "edited", "insert": "edited"}
_SEARCH_TOOLS = {
    "grep",
    "glob",
    "list",
    "ls",
    "search",
    "find",
    "find_file",
    "search_dir",
    "search_file",
    "codesearch",
    "websearch",
    "webfetch",
    "goto",
    "scroll_up",
    "scroll_down",
}
_PATH_KEYS = (
    "filePath",
    "file_path",
    "path",
    "filename",
    "file",
    "notebook_path",
    "target_file",
    "absolute_path",
)
_PATCH_FILE = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.+?)\s*$|^\*\*\* Move to: (.+?)\s*$")
_DIFF_FILE = re.compile(r"^\+\+\+ (?:b/)?(\S+)")
_PATCH_VERBS = {"Add": "created", "Update": "edited", "Delete": "deleted"}
_OPEN_FILE = re.compile(r"\(Open file: ([^)\n]+)\)")
_CURRENT_DIR = re.compile(r"\(Current directory: ([^)\n]+)\)")
_DIRECTORY_LISTING = re.compile(
    r"files and directories up to|<type>directory</type>|is a directory|points to a directory",
    re.IGNORECASE,
)


@dataclass
class _Action:
    """What one step did to files: reads, (path, verb) changes, a file-changing command."""

    reads: list[str] = field(default_factory=list)
    changes: list[tuple[str, str]] = field(default_factory=list)
    command: str | None = None  # the shell command, for shell steps
    shell_change: bool = False  # the command creates, moves or deletes files
    quiet: bool = False  # a read or search: its output is content, not a report of errors
    opens: bool = False  # SWE-agent's `open x` / `create x`: x becomes the open file


class _FileActivity:
    """The reads and changes of every step, with SWE-agent's open file and directory tracked."""

    def __init__(self, steps: list[_Step]) -> None:
        self.actions: list[_Action] = []
        open_file: str | None = None
        cwd: str | None = None
        for step in steps:
            cwd = _last(_CURRENT_DIR, step.result) or cwd
            action = _classify_step(step, open_file)
            shown = _last(_OPEN_FILE, step.result)  # SWE-agent prints it after every command
            if shown is not None:
                shown = None if shown.strip().lower() == "n/a" else shown.strip()
                if action.opens and shown:
                    # `open x` / `create x` name x as typed; the result names it in full.
                    action.reads = [shown] if action.reads else []
                    action.changes = [(shown, verb) for _, verb in action.changes]
                open_file = shown
            action.reads = [_resolve(path, cwd) for path in action.reads]
            action.changes = [(_resolve(path, cwd), verb) for path, verb in action.changes]
            if shown is None and action.opens:
                open_file = next(iter(action.reads + [p for p, _ in action.changes]), open_file)
            self.actions.append(action)

    def changes(self) -> list[str]:
        """One line per changed path and per file-changing command, in first-seen order."""
        verbs: dict[str, list[str]] = {}
        order: list[tuple[str, str]] = []  # ("path" | "command", path or line)
        commands: set[str] = set()
        for action in self.actions:
            for path, verb in action.changes:
                if path not in verbs:
                    verbs[path] = []
                    order.append(("path", path))
                verbs[path].append(verb)
            if action.shell_change and action.command:
                line = "ran: " + _command_line(action.command)
                if normalize(line) not in commands:
                    commands.add(normalize(line))
                    order.append(("command", line))
        lines = [_describe(key, verbs[key]) if kind == "path" else key for kind, key in order]
        return lines[-MAX_ITEMS:]

    def most_read(self) -> list[tuple[str, int]]:
        """The most read paths with their counts; ties in first-read order."""
        counts: Counter[str] = Counter()
        first: dict[str, int] = {}
        for action in self.actions:
            for path in action.reads:
                counts[path] += 1
                first.setdefault(path, len(first))
        ranked = sorted(counts.items(), key=lambda pair: (-pair[1], first[pair[0]]))
        return ranked[:MAX_FILES_READ]


def _describe(path: str, verbs: list[str]) -> str:
    kept = [verb for verb in verbs if verb != "deleted"]
    if not kept:
        return f"deleted {path}"
    if "created" in kept:
        text = f"created {path}"
        if len(kept) > 1:
            text += f", edited ({len(kept) - 1}{TIMES})"
    else:
        verb = "wrote" if all(verb == "wrote" for verb in kept) else "edited"
        text = f"{verb} {path}" + (f" ({len(kept)}{TIMES})" if len(kept) > 1 else "")
    return text + (", then deleted" if verbs[-1] == "deleted" else "")


def _classify_step(step: _Step, open_file: str | None) -> _Action:
    name, args = step.name, step.args
    path = _path_argument(args)
    if name in SHELL_TOOLS:
        command = command_text(step.raw_args) or (step.raw_args if not args else "")
        return _shell_action(command, open_file)
    action = _Action()
    listing = bool(_DIRECTORY_LISTING.search(step.result[:400]))
    if name in EDITOR_TOOLS:
        command = str(args.get("command", ""))
        if command == "view":
            action.quiet = True
            if path and not listing:
                action.reads.append(path)
        elif command in _EDITOR_COMMANDS and path:
            action.changes.append((path, _EDITOR_COMMANDS[command]))
    elif name in _READ_TOOLS:
        action.quiet = True
        action.opens = name == "open"
        if path and not listing:
            action.reads.append(path)
    elif name in _CREATE_TOOLS:
        action.opens = name == "create"
        if path:
            action.changes.append((path, "created"))
    elif name in _WRITE_TOOLS:
        if path:
            action.changes.append((path, "wrote"))
    elif name in _EDIT_TOOLS:
        target = path or open_file  # SWE-agent's edit / insert change the open file
        if target:
            action.changes.append((target, "edited"))
    elif name in _PATCH_TOOLS or "*** Begin Patch" in step.raw_args:
        action.changes.extend(_patch_changes(args, step.raw_args))
        if path and not action.changes:
            action.changes.append((path, "edited"))
    elif name in _SEARCH_TOOLS:
        action.quiet = True
    return action


def _path_argument(args: dict[str, Any]) -> str | None:
    for key in _PATH_KEYS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _patch_changes(args: dict[str, Any], raw: str) -> list[tuple[str, str]]:
    texts = [value for value in args.values() if isinstance(value, str)] or [raw]
    changes: list[tuple[str, str]] = []
    for text in texts:
        for line in text.split("\n"):
            match = _PATCH_FILE.match(line)
            if match and match[2]:
                changes.append((match[2], _PATCH_VERBS[match[1]]))
            elif match:
                changes.append((match[3], "edited"))
            elif (diff := _DIFF_FILE.match(line)) and diff[1] != "/dev/null":
                changes.append((diff[1], "edited"))
    return changes


# -- shell commands

_NOT_FILES = {"/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"}
_CHANGE_COMMANDS = {"mv", "rm", "cp", "mkdir", "touch", "rmdir", "ln", "tee", "unlink", "truncate"}
_GIT_CHANGES = {"mv", "rm"}
_READ_COMMANDS = {"cat", "head", "tail", "less", "more", "nl", "bat"}
_QUIET_COMMANDS = _READ_COMMANDS | {
    "grep",
    "rg",
    "ag",
    "find",
    "ls",
    "tree",
    "wc",
    "echo",
    "printf",
    "pwd",
    "which",
    "file",
    "stat",
    "diff",
}
_SETUP_COMMANDS = {"cd", "export", "source", ".", "set", "pushd", "popd", "unset", "alias"}
# SWE-agent's own commands, run through its bash tool.
_SWE_QUIET = {
    "goto",
    "scroll_up",
    "scroll_down",
    "search_file",
    "search_dir",
    "find_file",
    "submit",
}
_SWE_EDIT = re.compile(r"^edit\s+\d+:\d+\b")


def _shell_action(command: str, open_file: str | None) -> _Action:
    """What a shell command did to files, SWE-agent's commands run through bash included."""
    action = _Action(command=command)
    steps = shell_steps(command)
    words = steps[0].words if steps else ()
    head = words[0] if words else ""
    if head in {"open", "create"} and len(words) > 1:
        action.opens = True
        if head == "open":
            action.quiet = True
            action.reads.append(words[1])
        else:
            action.changes.append((words[1], "created"))
        return action
    if _SWE_EDIT.match(command.strip().split("\n", 1)[0].strip()):
        if open_file:
            action.changes.append((open_file, "edited"))
        return action
    if head in _SWE_QUIET:
        action.quiet = True
        return action
    primary: str | None = None
    for step in steps:
        words = step.words
        if words and words[0] in _SETUP_COMMANDS:
            continue
        word = posixpath.basename(words[0]) if words else ""
        primary = primary or word or None
        if (
            any(target not in _NOT_FILES for target in step.writes)
            or word in _CHANGE_COMMANDS
            or (word == "git" and len(words) > 1 and words[1] in _GIT_CHANGES)
            or (word == "sed" and any(w.startswith(("-i", "--in-place")) for w in words))
            or (word == "perl" and any(w.startswith("-") and "i" in w for w in words[1:]))
        ):
            action.shell_change = True
        elif word in _READ_COMMANDS:
            action.reads.extend(_read_arguments(words[1:]))
    action.quiet = primary in _QUIET_COMMANDS and not action.shell_change
    return action


def _read_arguments(arguments: Iterable[str]) -> list[str]:
    paths: list[str] = []
    skip_next = False
    for word in arguments:
        if skip_next:
            skip_next = False
        elif word in {"-n", "-c", "--lines", "--bytes"}:
            skip_next = True
        elif word and not word.startswith("-") and not word.lstrip("+").isdigit():
            paths.append(word)
    return paths


def _command_line(command: str) -> str:
    lines = [line for line in command.strip().split("\n") if line.strip()]
    text = _one_line(lines[0] if lines else "")
    if len(lines) > 1:
        text += " …"
    return _one_line(text, COMMAND_CHARS)


def _resolve(path: str, cwd: str | None) -> str:
    path = path.strip()
    if cwd and path and not path.startswith(("/", "~")) and "://" not in path:
        return posixpath.normpath(posixpath.join(cwd.strip(), path))
    return path


def _last(pattern: re.Pattern[str], text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


# -- gotchas

_TRACEBACK = "Traceback (most recent call last)"
_EXCEPTION_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?(?:E\d*\s+)?(?:[A-Za-z_]\w*\.)*"
    r"(?:[A-Z]\w*(?:Error|Exception)|KeyboardInterrupt|SystemExit)(?::.*)?$"
)
_ERROR_LINES: tuple[tuple[re.Pattern[str], bool], ...] = (  # (pattern, take the last match)
    (re.compile(r"^\s*FAILED\b"), False),
    (_EXCEPTION_LINE, True),
    (
        re.compile(
            r"(?:^|\s)(?:error|Error|ERROR)(?:\[\w+\]|\s+[A-Z]+\d+)?:|^\s*(?:fatal|FATAL|panic|FAIL)\b"
            r"|npm ERR!|command not found|No such file or directory|Permission denied"
            r"|Segmentation fault|Exception in thread|\b[1-9]\d* (?:failed|errors?)\b"
            r"|syntax error|No replacement was performed"
        ),
        False,
    ),
    (re.compile(r"错误|失败|异常|报错"), False),
)
_EXIT_CODE = re.compile(
    r"exit (?:code|status)[:\s]*([1-9]\d*)|non-zero exit status (\d+)", re.IGNORECASE
)
_BULLET = re.compile(r"^[-*]\s+")
_ANNOTATION = re.compile(r"(?<=\S)\s*\[[A-Z][\w ]*: [^\]]*\]$")  # "[Python Interpreter: …]"
# How a tool other than a shell says it failed (OpenCode's "Error: …", editors' complaints).
_TOOL_FAILURE = re.compile(
    r"^\s*(?:OBSERVATION:\s*)?(?:error|Error|ERROR)\b|syntax error|No replacement was performed"
    r"|did not appear verbatim|old_string not found|错误|失败"
)


def _error_line(result: str, command: str) -> str | None:
    """The line of a tool result that reports an error, or None when it reports none."""
    lines = [line.strip() for line in result.split("\n") if line.strip()]
    if _TRACEBACK in result:
        after = lines[max(i for i, line in enumerate(lines) if _TRACEBACK in line) + 1 :]
        exceptions = [line for line in after if _EXCEPTION_LINE.match(line)]
        if exceptions or after:
            return _clean_error((exceptions or after)[-1])
    failed = next((line for line in lines if _ERROR_LINES[0][0].search(line)), None)
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    if failed is not None and exceptions:
        # "FAILED test_x" names the test, the exception line says what went wrong: keep both.
        reason = re.sub(r"^E\d*\s+", "", _clean_error(exceptions[-1]))
        if reason not in failed:
            return _one_line(f"{_clean_error(failed)} — {reason}", ERROR_CHARS)
    for pattern, take_last in _ERROR_LINES:
        matching = [line for line in lines if pattern.search(line)]
        if matching:
            return _clean_error(matching[-1] if take_last else matching[0])
    exit_code = _EXIT_CODE.search(result)
    if exit_code is not None:
        code = exit_code[1] or exit_code[2]
        what = f"`{_command_line(command)}`" if command.strip() else "the command"
        return _one_line(f"{what} exited with code {code}", ERROR_CHARS)
    return None


def _clean_error(line: str) -> str:
    """One error line without a list marker or a trailing ``[Tool annotation: …]``."""
    line = _ANNOTATION.sub("", _BULLET.sub("", line)) or line
    return _one_line(line, ERROR_CHARS)


def _first_line(text: str) -> str | None:
    line = next((line for line in text.split("\n") if line.strip()), None)
    return None if line is None else _clean_error(line)


def _gotchas(steps: list[_Step], actions: list[_Action]) -> list[tuple[int, str]]:
    """``<error line> → fixed by editing <paths>`` for each error an edit soon followed."""
    edits = [[path for path, _ in action.changes] for action in actions]
    found: list[tuple[int, str]] = []
    for index, (step, action) in enumerate(zip(steps, actions, strict=True)):
        if not step.answered or action.quiet:
            continue
        if action.command is None:
            failure = _TOOL_FAILURE.search(step.result)
            error = (_error_line(step.result, "") or _first_line(step.result)) if failure else None
        else:
            error = _error_line(step.result, action.command)
        if error is None:
            continue
        window = range(index + 1, min(index + 1 + FIX_WINDOW, len(steps)))
        first_edit = next((i for i in window if edits[i]), None)
        if first_edit is None:
            continue
        paths: list[str] = []
        for later in range(first_edit, len(steps)):
            if not edits[later]:
                break
            paths += [path for path in edits[later] if path not in paths]
        shown = ", ".join(paths[:3]) + (", …" if len(paths) > 3 else "")
        found.append((step.position, f"{error} → fixed by editing {shown}"))
    return found


# ---------------------------------------------------------------- helpers


def _one_line(text: str, limit: int | None = None) -> str:
    line = " ".join(text.split())
    if limit is not None and len(line) > limit:
        line = line[: limit - 1].rstrip() + "…"
    return line


def _unique(items: Iterable[tuple[int, str]]) -> list[tuple[int, str]]:
    """The first occurrence of each normalized text, in order of position."""
    seen: set[str] = set()
    kept: list[tuple[int, str]] = []
    for position, text in sorted(items, key=lambda pair: pair[0]):
        key = normalize(text)
        if key and key not in seen:
            seen.add(key)
            kept.append((position, text))
    return kept


def _limit(items: Iterable[tuple[int, str]]) -> list[str]:
    """The latest ``MAX_ITEMS`` distinct texts, in first-seen order."""
    return [text for _, text in _unique(items)][-MAX_ITEMS:]


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
