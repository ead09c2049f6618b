"""Hypothesis strategies: agent sessions in a dialect-neutral model, rendered into each of the
three wire formats (OpenAI chat completions, Anthropic messages, OpenAI Responses).

A session is a system prompt and user turns; each turn is a run of assistant steps (optional
reasoning and text, one or more tool calls, their outputs) and, except for the last turn, a
closing assistant answer. Tool outputs are built from a few drawn parameters so that large,
realistic outputs (numbered file views, test logs with failures, ``path:line:`` grep output,
path listings, JSON arrays, markdown reports) cost hypothesis only a handful of choices.

``render`` turns a session into one full request body of a dialect plus the request
boundaries a client would send: request k is the body with the first ``boundaries[k].end``
messages (or input items), sent after each user message and after each step's tool results.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import strategies as st

from compressors.pipeline import CompressionSettings
from compressors.view import Dialect

JsonObject = dict[str, Any]

WORDS = (
    "config",
    "parser",
    "handler",
    "session",
    "token",
    "cache",
    "request",
    "router",
    "schema",
    "worker",
    "queue",
    "buffer",
    "stream",
    "client",
    "server",
    "record",
    "index",
    "payload",
    "retry",
    "checkpoint",
)

# Text a model or a user may really send: any unicode (no lone surrogates: those cannot be
# sent as JSON), control characters, line and paragraph separators, CJK, emoji.
noise_text = st.text(max_size=24)
words = st.lists(st.sampled_from(WORDS), min_size=2, max_size=5, unique=True)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: JsonObject
    output: str


@dataclass(frozen=True)
class Reasoning:
    text: str
    signature: str
    redacted: bool = False  # Anthropic redacted_thinking; other dialects send the text


@dataclass(frozen=True)
class Step:
    reasoning: Reasoning | None
    text: str | None
    calls: tuple[ToolCall, ...]


@dataclass(frozen=True)
class Answer:
    reasoning: Reasoning | None
    text: str


@dataclass(frozen=True)
class Turn:
    user: str
    steps: tuple[Step, ...]
    answer: Answer | None  # None for the last turn: the session stops inside its tool loop


@dataclass(frozen=True)
class Session:
    system: str
    turns: tuple[Turn, ...]
    variant: int = 0  # picks among equivalent spellings (string or list content, reasoning key)


# --- tool outputs -------------------------------------------------------------------------


def _sprinkle(lines: list[str], noise: list[str], every: int) -> list[str]:
    """Put drawn unicode noise into a few lines, so odd text sits inside realistic output."""
    for index, text in enumerate(noise):
        at = (index * every + every // 2) % max(len(lines), 1)
        if lines:
            lines[at] = f"{lines[at]} {text}"
    return lines


def file_view(path: str, count: int, names: list[str], noise: list[str]) -> str:
    lines: list[str] = []
    for n in range(1, count + 1):
        name = names[n % len(names)]
        shape = n % 9
        if shape == 0:
            lines.append(f"class {name.title()}{n}({names[0].title()}Base):")
        elif shape == 1:
            lines.append(f"    def {name}_{n}(self, {names[-1]}: int = {n}) -> None:")
        elif shape == 2:
            lines.append(f'        """Handle the {name} {n} of the {names[0]}."""')
        elif shape in (3, 4):
            lines.append(f"        self.{name}_{n} = compute_{name}(self.{names[0]}, {n})")
        elif shape == 5:
            lines.append(f"        if self.{name}_{n} is None:")
        elif shape == 6:
            lines.append(f"            raise {name.title()}Error('{name} {n} missing')")
        elif shape == 7:
            lines.append(f"        return self.{name}_{n}")
        else:
            lines.append("")
    lines = _sprinkle(lines, noise, 37)
    numbered = "\n".join(f"{n}: {line}" for n, line in enumerate(lines, 1))
    return (
        f"<path>{path}</path>\n<type>file</type>\n<content>\n{numbered}\n\n"
        f"(End of file - total {count} lines)\n</content>"
    )


def unit_test_log(count: int, failures: int, names: list[str], noise: list[str]) -> str:
    head = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.9, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /repo",
        f"collected {count} items",
        "",
    ]
    failing = {(k * 37 + 7) % count for k in range(failures)}
    body = []
    for n in range(count):
        name = names[n % len(names)]
        verdict = "FAILED" if n in failing else "PASSED"
        body.append(f"tests/test_{name}.py::test_{name}_{n} {verdict} [{100 * n // count:3d}%]")
    body = _sprinkle(body, noise, 41)
    trace = []
    for k in range(failures):
        name = names[k % len(names)]
        trace += [
            f"____________________________ test_{name}_{k} ____________________________",
            f"    def test_{name}_{k}():",
            f">       assert load_{name}({k}) == {k + 1}",
            f"E       AssertionError: assert {k} == {k + 1}",
            f"E        +  where {k} = load_{name}({k})",
            "",
            f"src/pkg/{name}.py:{40 + k}: AssertionError",
        ]
    tail = [
        "=========================== short test summary info ============================",
        *(
            f"FAILED tests/test_{names[k % len(names)]}.py::test_x - AssertionError"
            for k in range(failures)
        ),
        f"========== {failures} failed, {count - failures} passed in 12.34s ==========",
    ]
    return "\n".join(head + body + ["", "=" * 30 + " FAILURES " + "=" * 30] + trace + tail)


def build_log(count: int, names: list[str], noise: list[str]) -> str:
    lines = [
        f"[{100 * n // count:3d}%] Building CXX object src/{names[n % len(names)]}/unit_{n}.cpp.o"
        for n in range(count)
    ]
    lines[count // 2] = (
        f"src/{names[0]}/unit_{count // 2}.cpp:88:13: error: use of undeclared identifier "
        f"'{names[-1]}_handle'"
    )
    lines = _sprinkle(lines, noise, 29)
    return "\n".join([*lines, "make[2]: *** [Makefile:120: all] Error 2", "make: *** Error 2"])


def grep_output(count: int, names: list[str], noise: list[str]) -> str:
    lines = []
    for n in range(count):
        name = names[n % len(names)]
        path = f"src/{names[(n // 7) % len(names)]}/{name}_{n // 13}.py"
        lines.append(f"{path}:{10 + n * 3}:    result = {name}.lookup_{name}(key_{n})")
    return "\n".join(_sprinkle(lines, noise, 23))


def path_listing(count: int, names: list[str], noise: list[str]) -> str:
    lines = []
    for n in range(count):
        top = names[n % len(names)]
        sub = names[(n // 5) % len(names)]
        lines.append(f"/repo/src/{top}/{sub}_{n % 11}/module_{n}.py")
    return "\n".join(_sprinkle(lines, noise, 53))


def json_array(count: int, names: list[str], noise: list[str], indent: bool) -> str:
    items = [
        {
            "id": n,
            "name": f"{names[n % len(names)]}_{n}",
            "path": f"src/{names[n % len(names)]}/file_{n}.py",
            "status": "error" if n % 17 == 3 else "ok",
            "message": noise[n % len(noise)] if noise else f"item {n}",
        }
        for n in range(count)
    ]
    return orjson.dumps(items, option=orjson.OPT_INDENT_2 if indent else 0).decode()


def report(count: int, names: list[str], noise: list[str]) -> str:
    parts = ["# Investigation report", ""]
    for n in range(count):
        name = names[n % len(names)]
        parts += [
            f"## {name.title()} section {n}",
            "",
            f"The `{name}_{n}` path in src/{name}.py handles {names[0]} retries because the "
            f"upstream may fail; see line {n * 4} for the fix we must keep.",
            "",
        ]
    parts += ["## Summary", "", "The failing case is fixed by the retry in the handler."]
    return "\n".join(_sprinkle(parts, noise, 19))


SMALL_OUTPUTS = (
    "",
    "ok",
    "On branch main\nnothing to commit, working tree clean",
    "README.md\nsetup.py\nsrc\ntests",
    "Edit applied successfully.",
    "1 passed in 0.01s",
)


@st.composite
def large_call(draw: st.DrawFn) -> ToolCall:
    kind = draw(st.sampled_from(["read", "pytest", "make", "grep", "glob", "find", "json", "task"]))
    names = draw(words)
    noise = draw(st.lists(noise_text, max_size=3))
    count = draw(st.integers(60, 700))
    path = f"/repo/src/{names[0]}/{names[1]}.py"
    if kind == "read":
        return ToolCall("read", {"filePath": path}, file_view(path, count, names, noise))
    if kind == "pytest":
        failures = draw(st.integers(0, 4))
        command = {"command": f"pytest -x tests/test_{names[0]}.py", "description": "Run tests"}
        return ToolCall("bash", command, unit_test_log(count, failures, names, noise))
    if kind == "make":
        return ToolCall("bash", {"command": "make -j4"}, build_log(count, names, noise))
    if kind == "grep":
        arguments = {"pattern": f"lookup_{names[0]}", "path": "/repo"}
        return ToolCall("grep", arguments, grep_output(count, names, noise))
    if kind == "glob":
        return ToolCall("glob", {"pattern": "**/*.py"}, path_listing(count, names, noise))
    if kind == "find":
        command = {"command": "find /repo -name '*.py'", "description": "List sources"}
        return ToolCall("bash", command, path_listing(count * 3, names, noise))
    if kind == "json":
        indent = draw(st.booleans())
        arguments = {"repo": f"acme/{names[0]}", "state": "all"}
        return ToolCall("list_issues", arguments, json_array(count // 2, names, noise, indent))
    arguments = {"description": f"Investigate {names[0]}", "prompt": f"Why does {names[1]} fail?"}
    return ToolCall("task", arguments, report(count // 4 + 1, names, noise))


@st.composite
def small_call(draw: st.DrawFn) -> ToolCall:
    name = draw(st.sampled_from(["bash", "edit", "read", "todowrite"]))
    output = draw(st.sampled_from(SMALL_OUTPUTS) | noise_text)
    if name == "edit":
        arguments: JsonObject = {"filePath": "/repo/a.py", "oldString": "a", "newString": "b"}
    elif name == "read":
        arguments = {"filePath": "/repo/README.md"}
    elif name == "todowrite":
        arguments = {"todos": [{"content": "fix", "status": "pending"}]}
    else:
        arguments = {"command": draw(st.sampled_from(["git status", "ls", "echo hi"]))}
    return ToolCall(name, arguments, output)


@st.composite
def protected_large_call(draw: st.DrawFn) -> ToolCall:
    """A large result of a tool whose results are never compressed (an edit's diff)."""
    names = draw(words)
    count = draw(st.integers(60, 300))
    diff = "\n".join(f"+    {names[n % len(names)]}_{n} = {n}" for n in range(count))
    return ToolCall("edit", {"filePath": "/repo/x.py", "oldString": "", "newString": "y"}, diff)


tool_call = st.one_of(large_call(), large_call(), small_call(), protected_large_call())

signatures = st.binary(min_size=8, max_size=48).map(lambda b: base64.b64encode(b).decode())


@st.composite
def reasoning(draw: st.DrawFn) -> Reasoning:
    text = draw(st.text(min_size=1, max_size=60))
    return Reasoning(text, draw(signatures), draw(st.integers(0, 5)) == 0)


def reminder(text: str) -> str:
    """An OpenCode-style reminder long enough to be dropped from old turns."""
    filler = " ".join(f"Rule {n}: keep {text or 'going'} consistent." for n in range(20))
    return f"<system-reminder>\n{filler}\n</system-reminder>"


@st.composite
def user_text(draw: st.DrawFn) -> str:
    text = draw(st.text(min_size=1, max_size=60))
    if draw(st.integers(0, 3)) == 0:
        text = f"{text}\n\n{reminder(draw(noise_text))}"
    return text


@st.composite
def assistant_text(draw: st.DrawFn) -> str:
    text = draw(st.text(min_size=1, max_size=60))
    if draw(st.integers(0, 4)) == 0:
        text = f"<think>{draw(noise_text)}</think>\n{text}"
    return text


@st.composite
def steps(draw: st.DrawFn, earlier: list[ToolCall]) -> tuple[Step, ...]:
    """Steps of one turn; sometimes a call repeats an earlier one exactly (same tool,
    arguments and output), as an agent re-running a command or re-reading a file does."""
    result = []
    for _ in range(draw(st.integers(1, 3))):
        calls = []
        for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
            if earlier and draw(st.integers(0, 5)) == 0:
                call = draw(st.sampled_from(earlier))
            else:
                call = draw(tool_call)
            calls.append(call)
            earlier.append(call)
        think = draw(st.none() | reasoning())
        text = draw(st.none() | st.text(min_size=1, max_size=40))
        result.append(Step(think, text, tuple(calls)))
    return tuple(result)


@st.composite
def sessions(draw: st.DrawFn, min_turns: int = 1, max_turns: int = 3) -> Session:
    system = "You are an agent. " + draw(st.text(max_size=40))
    count = draw(st.integers(min_turns, max_turns))
    earlier: list[ToolCall] = []
    turns = []
    for index in range(count):
        user = draw(user_text())
        turn_steps = draw(steps(earlier))
        answer = None
        if index < count - 1:
            answer = Answer(draw(st.none() | reasoning()), draw(assistant_text()))
        turns.append(Turn(user, turn_steps, answer))
    return Session(system, tuple(turns), draw(st.integers(0, 5)))


settings_strategy = st.builds(
    CompressionSettings,
    tail_tokens=st.sampled_from([0, 0, 1_500, 20_000]),
    min_output_tokens=st.sampled_from([250, 80]),
    pressure_thresholds=st.sampled_from([(50_000, 150_000), (6_000,), (4_000, 15_000)]),
    compress_live_turn=st.booleans(),
    arrival_kinds=st.sampled_from([CompressionSettings().arrival_kinds, frozenset()]),
    max_work_chars=st.sampled_from([CompressionSettings().max_work_chars, 3_000]),
)


# --- rendering ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Boundary:
    """A request: the first ``end`` messages; ``latest_calls`` are the ids of the calls of
    the last step in it (their results are the latest step's)."""

    end: int
    latest_calls: frozenset[str]


@dataclass
class Rendered:
    dialect: Dialect
    body: JsonObject
    boundaries: list[Boundary] = field(default_factory=list)
    # Anthropic: a cache mark on the last block of each of the request's last messages, as
    # OpenCode sends them (so the messages that had them come again changed).
    cache_marks: int = 0

    @property
    def list_key(self) -> str:
        return "input" if self.dialect is Dialect.OPENAI_RESPONSES else "messages"

    def request(self, boundary: Boundary) -> JsonObject:
        """The body of one request (new containers; strings are shared, never edited)."""
        body = orjson.loads(orjson.dumps(self.body))
        body[self.list_key] = body[self.list_key][: boundary.end]
        return with_cache_marks(body, self.list_key, self.cache_marks)


def _ephemeral() -> JsonObject:
    """A cache mark of its own: a test may edit the request it is in."""
    return {"type": "ephemeral"}


def with_cache_marks(body: JsonObject, list_key: str, count: int = 2) -> JsonObject:
    """``body`` as OpenCode sends Anthropic requests: a cache mark on the last block of each of
    its last ``count`` messages (on the message itself where its content is not a list of
    blocks), so those messages come again without it in the next request. Those messages and
    their marks are new containers; the rest is ``body``'s."""
    if not count:
        return body
    messages = body[list_key] = list(body[list_key])
    for index in range(max(0, len(messages) - count), len(messages)):
        message = messages[index] = dict(messages[index])
        content = message.get("content")
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            message["content"] = [*content[:-1], {**content[-1], "cache_control": _ephemeral()}]
        else:
            message["cache_control"] = _ephemeral()
    return body


def render(session: Session, dialect: Dialect) -> Rendered:
    if dialect is Dialect.OPENAI_CHAT:
        return _render_chat(session, session.variant)
    if dialect is Dialect.ANTHROPIC:
        return _render_anthropic(session, session.variant)
    return _render_responses(session, session.variant)


def renderings(session: Session) -> list[Rendered]:
    """The session in each of the three wire formats."""
    return [render(session, dialect) for dialect in Dialect]


def _arguments_text(call: ToolCall) -> str:
    return orjson.dumps(call.arguments).decode()


def _tool_names(session: Session) -> list[str]:
    names = {c.name for turn in session.turns for step in turn.steps for c in step.calls}
    return sorted(names | {"bash"})


def _render_chat(session: Session, variant: int) -> Rendered:
    reasoning_key = ("reasoning_content", "reasoning")[variant % 2]
    messages: list[JsonObject] = [{"role": "system", "content": session.system}]
    boundaries: list[Boundary] = []
    latest: frozenset[str] = frozenset()
    for t, turn in enumerate(session.turns):
        content: Any = turn.user
        if variant % 3 == 2:
            content = [{"type": "text", "text": turn.user}]
        messages.append({"role": "user", "content": content})
        boundaries.append(Boundary(len(messages), latest))
        for s, step in enumerate(turn.steps):
            ids = [f"call_{t}_{s}_{c}" for c in range(len(step.calls))]
            message: JsonObject = {"role": "assistant", "content": step.text}
            if step.reasoning is not None:
                message[reasoning_key] = step.reasoning.text
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": _arguments_text(call)},
                }
                for call_id, call in zip(ids, step.calls, strict=True)
            ]
            messages.append(message)
            for call_id, call in zip(ids, step.calls, strict=True):
                messages.append({"role": "tool", "tool_call_id": call_id, "content": call.output})
            latest = frozenset(ids)
            boundaries.append(Boundary(len(messages), latest))
        if turn.answer is not None:
            message = {"role": "assistant", "content": turn.answer.text}
            if turn.answer.reasoning is not None:
                message[reasoning_key] = turn.answer.reasoning.text
            messages.append(message)
    tools = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in _tool_names(session)
    ]
    body = {"model": "deepseek-chat", "messages": messages, "tools": tools, "stream": True}
    return Rendered(Dialect.OPENAI_CHAT, body, boundaries)


def _thinking_block(think: Reasoning) -> JsonObject:
    if think.redacted:
        return {"type": "redacted_thinking", "data": think.signature}
    return {"type": "thinking", "thinking": think.text, "signature": think.signature}


def _render_anthropic(session: Session, variant: int) -> Rendered:
    messages: list[JsonObject] = []
    boundaries: list[Boundary] = []
    latest: frozenset[str] = frozenset()
    for t, turn in enumerate(session.turns):
        content: Any = [{"type": "text", "text": turn.user}]
        if variant % 3 == 1:
            content = turn.user
        messages.append({"role": "user", "content": content})
        boundaries.append(Boundary(len(messages), latest))
        for s, step in enumerate(turn.steps):
            ids = [f"toolu_{t}_{s}_{c}" for c in range(len(step.calls))]
            blocks: list[JsonObject] = []
            if step.reasoning is not None:
                blocks.append(_thinking_block(step.reasoning))
            if step.text is not None:
                blocks.append({"type": "text", "text": step.text})
            blocks += [
                {"type": "tool_use", "id": call_id, "name": call.name, "input": call.arguments}
                for call_id, call in zip(ids, step.calls, strict=True)
            ]
            messages.append({"role": "assistant", "content": blocks})
            results: list[JsonObject] = []
            for c, (call_id, call) in enumerate(zip(ids, step.calls, strict=True)):
                output: Any = call.output
                if (variant + c) % 2 == 1:
                    output = [{"type": "text", "text": call.output}]
                results.append({"type": "tool_result", "tool_use_id": call_id, "content": output})
            messages.append({"role": "user", "content": results})
            latest = frozenset(ids)
            boundaries.append(Boundary(len(messages), latest))
        if turn.answer is not None:
            blocks = []
            if turn.answer.reasoning is not None:
                blocks.append(_thinking_block(turn.answer.reasoning))
            blocks.append({"type": "text", "text": turn.answer.text})
            messages.append({"role": "assistant", "content": blocks})
    system: Any = session.system
    if variant % 2 == 0:
        system = [{"type": "text", "text": session.system, "cache_control": {"type": "ephemeral"}}]
    tools = [
        {"name": name, "description": name, "input_schema": {"type": "object"}}
        for name in _tool_names(session)
    ]
    body = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": system,
        "messages": messages,
        "tools": tools,
        "thinking": {"type": "enabled", "budget_tokens": 4000},
        "stream": True,
    }
    return Rendered(Dialect.ANTHROPIC, body, boundaries, cache_marks=2 if variant % 3 else 0)


def _reasoning_item(think: Reasoning, number: int) -> JsonObject:
    summary = [] if think.redacted else [{"type": "summary_text", "text": think.text}]
    return {
        "type": "reasoning",
        "id": f"rs_{number}",
        "summary": summary,
        "encrypted_content": think.signature,
    }


def _render_responses(session: Session, variant: int) -> Rendered:
    entries: list[JsonObject] = [{"role": "developer", "content": session.system}]
    boundaries: list[Boundary] = []
    latest: frozenset[str] = frozenset()
    number = 0
    for t, turn in enumerate(session.turns):
        user: JsonObject = {"role": "user", "content": [{"type": "input_text", "text": turn.user}]}
        if variant % 2 == 1:
            user = {"type": "message", **user}
        entries.append(user)
        boundaries.append(Boundary(len(entries), latest))
        for s, step in enumerate(turn.steps):
            ids = [f"call_{t}_{s}_{c}" for c in range(len(step.calls))]
            if step.reasoning is not None:
                number += 1
                entries.append(_reasoning_item(step.reasoning, number))
            if step.text is not None:
                entries.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": step.text}],
                    }
                )
            for call_id, call in zip(ids, step.calls, strict=True):
                entries.append(
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": call.name,
                        "arguments": _arguments_text(call),
                    }
                )
            for call_id, call in zip(ids, step.calls, strict=True):
                entries.append(
                    {"type": "function_call_output", "call_id": call_id, "output": call.output}
                )
            latest = frozenset(ids)
            boundaries.append(Boundary(len(entries), latest))
        if turn.answer is not None:
            if turn.answer.reasoning is not None:
                number += 1
                entries.append(_reasoning_item(turn.answer.reasoning, number))
            entries.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": turn.answer.text}],
                }
            )
    tools = [
        {"type": "function", "name": name, "parameters": {"type": "object"}}
        for name in _tool_names(session)
    ]
    body = {
        "model": "gpt-5.4",
        "input": entries,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "tools": tools,
        "stream": True,
    }
    return Rendered(Dialect.OPENAI_RESPONSES, body, boundaries)


@st.composite
def rendered_sessions(draw: st.DrawFn, min_turns: int = 1, max_turns: int = 3) -> Rendered:
    return render(draw(sessions(min_turns, max_turns)), draw(st.sampled_from(list(Dialect))))
