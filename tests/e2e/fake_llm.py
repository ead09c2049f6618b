"""A scripted fake LLM for the end-to-end test: three wire formats, streamed, on loopback.

It answers ``POST …/chat/completions`` (OpenAI chat completions SSE), ``POST …/messages``
(Anthropic messages SSE) and ``POST …/responses`` (OpenAI Responses SSE) and records every
request it receives (path, headers, the exact body bytes, what it decided to answer).

Every answer is decided from the request alone, so the script is deterministic whatever the
order in which OpenCode's parallel requests arrive:

- no tools and a ``<conversation>`` transcript in the last user text: a compaction request,
  answered with a summary carrying ``SUMMARY_TAG``;
- no tools and a system prompt about a title: a title;
- tools, the live turn started by a user text holding ``TURN1_TAG``: by the number of tool
  results since that user text, 0 → ``read`` the large file, 1 → run the log command with
  ``bash``, 2 → run it again, 3 → call deepmem's ``deep_expand`` MCP tool with the key of a
  ``[deep-memory: …]`` marker found in the request (the read's marker first), 4+ → a final
  text answer;
- tools, the live turn holding ``TURN2_TAG``: with no tool result yet, a ``read`` of a small
  file whose reported usage exceeds any context window, so OpenCode compacts before its next
  step; a request that carries the summary gets a final text answer.

Every agent answer carries reasoning (``reasoning_content``; a signed ``thinking`` block; a
``reasoning`` item with ``encrypted_content``) whose exact bytes are recorded, so the test
can check that the live turn's reasoning came back unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT, ANTHROPIC, RESPONSES = "chat", "anthropic", "responses"
API_BY_SUFFIX = (("/chat/completions", CHAT), ("/messages", ANTHROPIC), ("/responses", RESPONSES))

TURN1_TAG = "E2E-TURN-1"
TURN2_TAG = "E2E-TURN-2"
SUMMARY_TAG = "E2E-SUMMARY-7f3a"
FINAL1 = "E2E-FINAL-1: the build log was read twice and the module expanded again."
FINAL2 = "E2E-FINAL-2: continued after the compaction."
NO_MARKER = "E2E-NO-MARKER: the request carried no deep-memory marker to expand."
NO_COMPACTION = "E2E-NO-COMPACTION: the overflowing usage did not make OpenCode compact."
OVERFLOW_TOKENS = 5_000_000  # above every model's context window
TITLE = "E2E deepmem session"

# The marker grammar of DESIGN.md §4, written out here rather than imported from the proxy.
MARKER_RE = re.compile(
    r"\[deep-memory: [^\]\n]*? — original intact: deep_expand\(\"ccr:(?P<key>[0-9a-f]{24})\"\)\]"
)
CREATED = 1_750_000_000


@dataclass(frozen=True, slots=True)
class Entry:
    """One item of a request's conversation, whatever the wire format."""

    kind: str  # system | user | assistant | reasoning | tool_call | tool_result
    text: str = ""
    call_id: str = ""
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def api_for_path(path: str) -> str | None:
    path = path.split("?", 1)[0].rstrip("/")
    for suffix, api in API_BY_SUFFIX:
        if path.endswith(suffix):
            return api
    return None


def _text(content: Any) -> str:
    """The text of any of the three formats' content shapes."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    parts: list[str] = []
    for part in content if isinstance(content, list) else []:
        if isinstance(part, dict):
            value = part.get("text")
            if isinstance(value, str):
                parts.append(value)
            elif isinstance(part.get("content"), str | list):
                parts.append(_text(part["content"]))
        elif isinstance(part, str):
            parts.append(part)
    return "\n".join(parts)


def parse_entries(api: str, body: dict[str, Any]) -> list[Entry]:
    """The conversation of a request as a flat list of entries, in order."""
    if api == CHAT:
        return _chat_entries(body)
    if api == ANTHROPIC:
        return _anthropic_entries(body)
    return _responses_entries(body)


def _chat_entries(body: dict[str, Any]) -> list[Entry]:
    entries: list[Entry] = []
    for message in body.get("messages") or []:
        role = message.get("role")
        if role in ("system", "developer"):
            entries.append(Entry("system", _text(message.get("content"))))
        elif role == "user":
            entries.append(Entry("user", _text(message.get("content"))))
        elif role == "assistant":
            if isinstance(message.get("reasoning_content"), str):
                entries.append(Entry("reasoning", message["reasoning_content"]))
            if _text(message.get("content")):
                entries.append(Entry("assistant", _text(message.get("content"))))
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                entries.append(
                    Entry(
                        "tool_call",
                        call_id=call.get("id", ""),
                        name=function.get("name", ""),
                        extra={"arguments": function.get("arguments", "")},
                    )
                )
        elif role == "tool":
            entries.append(
                Entry("tool_result", _text(message.get("content")), message.get("tool_call_id", ""))
            )
    return entries


def _anthropic_entries(body: dict[str, Any]) -> list[Entry]:
    entries = [Entry("system", _text(body.get("system")))] if body.get("system") else []
    for message in body.get("messages") or []:
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if message.get("role") == "user":
            results = [b for b in blocks if b.get("type") == "tool_result"]
            for block in results:
                entries.append(
                    Entry("tool_result", _text(block.get("content")), block.get("tool_use_id", ""))
                )
            if not results:  # text riding along with tool results is a reminder, not a turn
                entries.append(Entry("user", _text([b for b in blocks if b.get("type") == "text"])))
            continue
        for block in blocks:
            kind = block.get("type")
            if kind == "thinking":
                entries.append(
                    Entry(
                        "reasoning",
                        block.get("thinking", ""),
                        extra={"signature": block.get("signature")},
                    )
                )
            elif kind == "redacted_thinking":
                entries.append(Entry("reasoning", "", extra={"data": block.get("data")}))
            elif kind == "text":
                entries.append(Entry("assistant", block.get("text", "")))
            elif kind == "tool_use":
                entries.append(
                    Entry(
                        "tool_call",
                        call_id=block.get("id", ""),
                        name=block.get("name", ""),
                        extra={"arguments": block.get("input")},
                    )
                )
    return entries


def _responses_entries(body: dict[str, Any]) -> list[Entry]:
    entries = [Entry("system", body["instructions"])] if body.get("instructions") else []
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        kind, role = item.get("type"), item.get("role")
        if role in ("system", "developer"):
            entries.append(Entry("system", _text(item.get("content"))))
        elif role == "user":
            entries.append(Entry("user", _text(item.get("content"))))
        elif role == "assistant":
            entries.append(Entry("assistant", _text(item.get("content"))))
        elif kind == "reasoning":
            summary = "".join(
                part.get("text", "") for part in item.get("summary") or [] if isinstance(part, dict)
            )
            entries.append(
                Entry(
                    "reasoning", summary, extra={"encrypted_content": item.get("encrypted_content")}
                )
            )
        elif kind == "function_call":
            entries.append(
                Entry(
                    "tool_call",
                    call_id=item.get("call_id", ""),
                    name=item.get("name", ""),
                    extra={"arguments": item.get("arguments", "")},
                )
            )
        elif kind == "function_call_output":
            entries.append(Entry("tool_result", _text(item.get("output")), item.get("call_id", "")))
    return entries


def tool_names(api: str, body: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in body.get("tools") or []:
        name = (tool.get("function") or {}).get("name") if api == CHAT else tool.get("name")
        if isinstance(name, str):
            names.append(name)
    return names


def live_turn(entries: list[Entry]) -> tuple[str, list[Entry]]:
    """The tag a user text of the live turn begins with, and the entries after that text.

    Only the beginning counts: text added to a user message later (deepmem's resume block
    quotes earlier prompts) must not be mistaken for the prompt.
    """
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.kind != "user":
            continue
        for tag in (TURN1_TAG, TURN2_TAG):
            if entry.text.lstrip().startswith(tag):
                return tag, entries[index + 1 :]
    return "", []


def markers_in(text: str) -> list[str]:
    return [match.group("key") for match in MARKER_RE.finditer(text)]


def choose_marker(entries: list[Entry]) -> tuple[str | None, str]:
    """The key to expand and where it was found: the read's result first, then any result."""
    calls = {e.call_id: e.name for e in entries if e.kind == "tool_call"}
    results = [e for e in entries if e.kind == "tool_result"]
    for entry in results:
        if calls.get(entry.call_id) == "read" and markers_in(entry.text):
            return markers_in(entry.text)[0], "read"
    for entry in results:
        if markers_in(entry.text):
            return markers_in(entry.text)[0], calls.get(entry.call_id, "?")
    return None, ""


def reasoning_artifacts(api: str, label: str) -> dict[str, str]:
    """Deterministic reasoning for one answer, with the provider's opaque companion."""
    text = f"E2E reasoning {label}: deciding the next step — naïve ✓ 思考 ({api})"
    digest = hashlib.sha256(text.encode()).digest()
    found = {"text": text}
    if api == ANTHROPIC:
        found["signature"] = "E2Esig" + base64.b64encode(digest * 3).decode()
    elif api == RESPONSES:
        found["encrypted_content"] = "gAAAAE2E" + base64.b64encode(digest * 4).decode()
        found["id"] = "rs_e2e_" + digest.hex()[:16]
    return found


@dataclass(slots=True)
class Plan:
    """What the fake answers to one request."""

    kind: str  # agent | title | compaction | other
    action: str  # read|bash|expand|final|overflow|no-marker|title|summary|other
    turn: str = ""
    step: int = 0
    text: str = ""
    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str = ""
    reasoning: dict[str, str] = field(default_factory=dict)
    expand_key: str = ""
    expand_from: str = ""
    input_tokens: int | None = None  # the usage to report; None: estimated from the body


@dataclass(frozen=True, slots=True)
class Script:
    """The scripted session: which file to read and which command to run."""

    read_path: str  # step 1 of turn 1
    command: str  # steps 2 and 3 of turn 1
    small_read_path: str  # step 1 of turn 2, answered with an overflowing usage
    command_description: str = "Run the build script and show its log"


def decide(api: str, body: dict[str, Any], script: Script) -> Plan:
    entries = parse_entries(api, body)
    tools = tool_names(api, body)
    users = [e.text for e in entries if e.kind == "user"]
    last_user = users[-1] if users else ""
    system = "\n".join(e.text for e in entries if e.kind == "system")
    if not tools:
        if "<conversation>" in last_user:
            summary = (
                f"## Objective\n- {SUMMARY_TAG}: inspect big_module.py and the build log\n\n"
                "## Progress\n- read big_module.py\n- ran the build script twice\n"
                "- expanded a deep-memory marker\n"
            )
            return Plan("compaction", "summary", text=summary)
        if "title" in system.lower():
            return Plan("title", "title", text=TITLE)
        return Plan("other", "other", text="OK.")
    turn, tail = live_turn(entries)
    step = sum(1 for e in tail if e.kind == "tool_result")
    summarised = SUMMARY_TAG in json.dumps(body, ensure_ascii=False)
    label = f"{turn or 'no-turn'}.{step}" + (".after-summary" if summarised else "")
    plan = Plan("agent", "final", turn=turn, step=step, reasoning=reasoning_artifacts(api, label))
    call_id = ("toolu_e2e_" if api == ANTHROPIC else "call_e2e_") + label.replace(".", "_")
    if summarised:
        plan.text = FINAL2
    elif turn == TURN1_TAG and step == 0:
        plan.action, plan.tool, plan.arguments = "read", "read", {"filePath": script.read_path}
    elif turn == TURN1_TAG and step in (1, 2):
        plan.action, plan.tool = "bash", "bash"
        plan.arguments = {"command": script.command, "description": script.command_description}
    elif turn == TURN1_TAG and step == 3:
        key, where = choose_marker(tail)
        if key is None:
            plan.action, plan.text = "no-marker", NO_MARKER
        else:
            expand = next((n for n in tools if n.endswith("deep_expand")), "deepmem_deep_expand")
            plan.action, plan.tool, plan.arguments = "expand", expand, {"key": f"ccr:{key}"}
            plan.expand_key, plan.expand_from = key, where
    elif turn == TURN1_TAG:
        plan.text = FINAL1
    elif turn == TURN2_TAG and step == 0:
        # A normal tool call whose usage says the context is full: OpenCode runs the tool,
        # then compacts before the next step. (An HTTP 400 context_length_exceeded also
        # makes it compact, but `opencode run` then reports the error and exits 1.)
        plan.action, plan.tool = "overflow", "read"
        plan.arguments = {"filePath": script.small_read_path}
        plan.input_tokens = OVERFLOW_TOKENS
    elif turn == TURN2_TAG:
        plan.text = NO_COMPACTION
    else:
        plan.text = "OK."
    if plan.tool:
        plan.call_id = call_id
    return plan


def _pieces(text: str, size: int = 3) -> list[str]:
    """``text`` in a few stream deltas (words kept whole, spaces kept)."""
    words = re.findall(r"\S+\s*", text)
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)] or [text]


def _input_tokens(plan: Plan, raw: bytes) -> int:
    return plan.input_tokens if plan.input_tokens is not None else max(1, len(raw) // 4)


def chat_events(plan: Plan, model: str, raw: bytes, include_usage: bool) -> list[bytes]:
    ident = "chatcmpl-e2e-" + hashlib.sha256(raw).hexdigest()[:12]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    events = [chunk({"role": "assistant", "content": ""})]
    if plan.reasoning:
        events += [chunk({"reasoning_content": p}) for p in _pieces(plan.reasoning["text"])]
    if plan.text:
        events += [chunk({"content": p}) for p in _pieces(plan.text)]
    finish = "stop"
    if plan.tool:
        arguments = json.dumps(plan.arguments)
        half = len(arguments) // 2
        first = {"name": plan.tool, "arguments": arguments[:half]}
        call = {"index": 0, "id": plan.call_id, "type": "function", "function": first}
        events.append(chunk({"tool_calls": [call]}))
        rest = {"index": 0, "function": {"arguments": arguments[half:]}}
        events.append(chunk({"tool_calls": [rest]}))
        finish = "tool_calls"
    events.append(chunk({}, finish))
    if include_usage:
        prompt = _input_tokens(plan, raw)
        usage = {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}
        events.append(dict(chunk({}), choices=[], usage=usage))
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def _named(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


def anthropic_events(plan: Plan, model: str, raw: bytes) -> list[bytes]:
    usage = {
        "input_tokens": _input_tokens(plan, raw),
        "output_tokens": 1,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    message = {
        "id": "msg_e2e_" + hashlib.sha256(raw).hexdigest()[:16],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    events = [
        _named("message_start", {"type": "message_start", "message": message}),
        _named("ping", {"type": "ping"}),
    ]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        events.append(
            _named(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": start},
            )
        )
        for delta in deltas:
            events.append(
                _named(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        events.append(_named("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1

    if plan.reasoning:
        deltas = [
            {"type": "thinking_delta", "thinking": p} for p in _pieces(plan.reasoning["text"])
        ]
        deltas.append({"type": "signature_delta", "signature": plan.reasoning["signature"]})
        block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
    if plan.text:
        block(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": p} for p in _pieces(plan.text)],
        )
    if plan.tool:
        arguments = json.dumps(plan.arguments)
        half = len(arguments) // 2
        block(
            {"type": "tool_use", "id": plan.call_id, "name": plan.tool, "input": {}},
            [
                {"type": "input_json_delta", "partial_json": arguments[:half]},
                {"type": "input_json_delta", "partial_json": arguments[half:]},
            ],
        )
    stop = "tool_use" if plan.tool else "end_turn"
    events.append(
        _named(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 20},
            },
        )
    )
    events.append(_named("message_stop", {"type": "message_stop"}))
    return events


def responses_events(plan: Plan, model: str, raw: bytes) -> list[bytes]:
    digest = hashlib.sha256(raw).hexdigest()
    output: list[dict[str, Any]] = []
    events: list[bytes] = []
    sequence = 0

    def emit(name: str, payload: dict[str, Any]) -> None:
        nonlocal sequence
        events.append(_named(name, {"type": name, "sequence_number": sequence, **payload}))
        sequence += 1

    prompt = _input_tokens(plan, raw)
    response: dict[str, Any] = {
        "id": "resp_e2e_" + digest[:16],
        "object": "response",
        "created_at": CREATED,
        "status": "in_progress",
        "model": model,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }
    emit("response.created", {"response": dict(response)})
    emit("response.in_progress", {"response": dict(response)})
    if plan.reasoning:
        index, text = len(output), plan.reasoning["text"]
        item = {
            "type": "reasoning",
            "id": plan.reasoning["id"],
            "encrypted_content": plan.reasoning["encrypted_content"],
            "summary": [],
        }
        emit("response.output_item.added", {"output_index": index, "item": item})
        where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        part = {"type": "summary_text", "text": ""}
        emit("response.reasoning_summary_part.added", {**where, "part": part})
        for piece in _pieces(text):
            emit("response.reasoning_summary_text.delta", {**where, "delta": piece})
        emit("response.reasoning_summary_text.done", {**where, "text": text})
        done_part = {"type": "summary_text", "text": text}
        emit("response.reasoning_summary_part.done", {**where, "part": done_part})
        item = dict(item, summary=[done_part])
        emit("response.output_item.done", {"output_index": index, "item": item})
        output.append(item)
    if plan.text:
        index = len(output)
        item = {
            "type": "message",
            "id": "msg_e2e_" + digest[:16],
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        emit("response.output_item.added", {"output_index": index, "item": item})
        where = {"item_id": item["id"], "output_index": index, "content_index": 0}
        empty = {"type": "output_text", "text": "", "annotations": []}
        emit("response.content_part.added", {**where, "part": empty})
        for piece in _pieces(plan.text):
            emit("response.output_text.delta", {**where, "delta": piece, "logprobs": []})
        emit("response.output_text.done", {**where, "text": plan.text, "logprobs": []})
        part = {"type": "output_text", "text": plan.text, "annotations": []}
        emit("response.content_part.done", {**where, "part": part})
        item = dict(item, status="completed", content=[part])
        emit("response.output_item.done", {"output_index": index, "item": item})
        output.append(item)
    if plan.tool:
        index, arguments = len(output), json.dumps(plan.arguments)
        item = {
            "type": "function_call",
            "id": "fc_e2e_" + digest[:16],
            "call_id": plan.call_id,
            "name": plan.tool,
            "arguments": "",
            "status": "in_progress",
        }
        emit("response.output_item.added", {"output_index": index, "item": item})
        where = {"item_id": item["id"], "output_index": index}
        half = len(arguments) // 2
        for piece in (arguments[:half], arguments[half:]):
            emit("response.function_call_arguments.delta", {**where, "delta": piece})
        emit("response.function_call_arguments.done", {**where, "arguments": arguments})
        item = dict(item, arguments=arguments, status="completed")
        emit("response.output_item.done", {"output_index": index, "item": item})
        output.append(item)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 10 if plan.reasoning else 0},
        "total_tokens": prompt + 20,
    }
    completed = dict(response, status="completed", output=output, usage=usage)
    emit("response.completed", {"response": completed})
    return events


@dataclass(slots=True)
class Record:
    """One request as the fake received it, and what it answered."""

    seq: int
    received_at: float
    method: str
    path: str
    api: str | None
    headers: dict[str, str]
    raw: str  # the body, decoded as UTF-8
    plan: dict[str, Any] | None


class FakeLLM:
    """The server; ``records`` grows as requests arrive. Use as a context manager."""

    def __init__(self, script: Script, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script = script
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def record(
        self, method: str, path: str, headers: dict[str, str], raw: bytes, plan: Plan | None
    ) -> None:
        with self._lock:
            self.records.append(
                Record(
                    len(self.records) + 1,
                    time.time(),
                    method,
                    path,
                    api_for_path(path),
                    headers,
                    raw.decode("utf-8", "replace"),
                    asdict(plan) if plan else None,
                )
            )

    def dump(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self.records]


def _handler_for(fake: FakeLLM) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, events: list[bytes]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            fake.record("GET", self.path, dict(self.headers.items()), b"", None)
            if self.path.split("?", 1)[0].rstrip("/").endswith("/models"):
                model = {"id": "fake-model", "object": "model", "owned_by": "e2e"}
                self._json(200, {"object": "list", "data": [model]})
            else:
                self._json(404, {"error": {"message": f"no such path {self.path}"}})

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = dict(self.headers.items())
            api = api_for_path(self.path)
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            if api is None or not isinstance(body, dict):
                fake.record("POST", self.path, headers, raw, None)
                self._json(404, {"error": {"message": f"fake LLM: no chat API at {self.path}"}})
                return
            plan = decide(api, body, fake.script)
            fake.record("POST", self.path, headers, raw, plan)
            if not body.get("stream"):
                self._json(400, {"error": {"message": "the e2e fake LLM answers streams only"}})
                return
            model = str(body.get("model", "fake-model"))
            if api == CHAT:
                usage = bool((body.get("stream_options") or {}).get("include_usage"))
                self._stream(chat_events(plan, model, raw, usage))
            elif api == ANTHROPIC:
                self._stream(anthropic_events(plan, model, raw))
            else:
                self._stream(responses_events(plan, model, raw))

    return Handler
