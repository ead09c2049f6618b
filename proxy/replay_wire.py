"""Corpus transcripts (OpenAI chat messages) as request bodies of each wire format, for replay.

``request_body`` builds what a client would send for ``messages[:k]``:

- ``chat``: the messages as they are.
- ``anthropic``: Anthropic Messages as OpenCode sends them: the leading system messages as
  top-level ``system`` blocks, reasoning as ``thinking`` blocks with a signature, tool calls as
  ``tool_use`` blocks and each run of tool messages as one user message of ``tool_result``
  blocks; ``cache_control`` on the system blocks and on the last block of the last two
  messages (never on a thinking block).
- ``responses``: OpenAI Responses: the leading system messages as ``instructions``, the rest
  as ``input`` items (``message``, ``reasoning`` with ``encrypted_content``, ``function_call``,
  ``function_call_output``).

``to_chat`` reads a body back into chat messages, ``payload`` is the part a provider tokenises
(``cache_control`` left out, since it moves every request) and ``paired_calls`` the tool calls
answered by the dialect's pairing rules.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import orjson

from compressors.view import Dialect
from compressors.wire import without_cache_marks

JsonObject = dict[str, Any]
DIALECTS: dict[str, Dialect] = {
    "chat": Dialect.OPENAI_CHAT,
    "anthropic": Dialect.ANTHROPIC,
    "responses": Dialect.OPENAI_RESPONSES,
}
EPHEMERAL = {"type": "ephemeral"}
MAX_TOKENS = 32_000


def tool_calls(message: JsonObject) -> list[JsonObject]:
    """A chat message's tool calls that are objects (a transcript may hold odd values)."""
    calls = message.get("tool_calls")
    return [call for call in calls if isinstance(call, dict)] if isinstance(calls, list) else []


def text_of(content: Any) -> str:
    """The text of a chat content: a string or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "") if isinstance(part, dict) else str(part) for part in content
        )
    return str(content)


def opaque(kind: str, text: str) -> str:
    """A stable stand-in for a provider's signature or encrypted reasoning."""
    return f"{kind}-" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _arguments_object(arguments: Any) -> JsonObject:
    if isinstance(arguments, dict):
        return arguments
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"arguments": arguments}


def _leading_system(messages: list[JsonObject]) -> int:
    count = 0
    while count < len(messages) and messages[count].get("role") in ("system", "developer"):
        count += 1
    return count


def _function(tool: JsonObject) -> JsonObject:
    function = tool.get("function")
    return function if isinstance(function, dict) else tool


def _schema(tool: JsonObject) -> JsonObject:
    schema = _function(tool).get("parameters")
    return schema if isinstance(schema, dict) else {"type": "object"}


# --- Anthropic Messages ------------------------------------------------------------------------


def _anthropic_assistant(message: JsonObject) -> list[JsonObject]:
    blocks: list[JsonObject] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        blocks.append(
            {"type": "thinking", "thinking": reasoning, "signature": opaque("sig", reasoning)}
        )
    if text := text_of(message.get("content")):
        blocks.append({"type": "text", "text": text})
    for call in tool_calls(message):
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": _arguments_object(function.get("arguments")),
            }
        )
    return blocks or [{"type": "text", "text": ""}]


def _anthropic_block(message: JsonObject) -> JsonObject:
    if message.get("role") == "tool":
        return {
            "type": "tool_result",
            "tool_use_id": message.get("tool_call_id"),
            "content": text_of(message.get("content")),
        }
    return {"type": "text", "text": text_of(message.get("content"))}


def _anthropic(messages: list[JsonObject], tools: list[JsonObject]) -> JsonObject:
    head = _leading_system(messages)
    wire: list[JsonObject] = []
    for message in messages[head:]:
        assistant = message.get("role") == "assistant"
        role = "assistant" if assistant else "user"
        blocks = _anthropic_assistant(message) if assistant else [_anthropic_block(message)]
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    for message in wire[-2:]:
        blocks = message["content"]
        for index in range(len(blocks) - 1, -1, -1):
            if blocks[index].get("type") != "thinking":
                blocks[index] = {**blocks[index], "cache_control": EPHEMERAL}
                break
    body: JsonObject = {"model": "replay", "max_tokens": MAX_TOKENS}
    if head:
        body["system"] = [
            {"type": "text", "text": text_of(m.get("content"))}
            | ({"cache_control": EPHEMERAL} if n < 2 else {})  # at most 4 breakpoints in all
            for n, m in enumerate(messages[:head])
        ]
    body["messages"] = wire
    if tools:
        body["tools"] = [
            {
                "name": _function(tool).get("name"),
                "description": _function(tool).get("description") or "",
                "input_schema": _schema(tool),
            }
            for tool in tools
        ]
    return body


def _chat_from_anthropic(body: JsonObject) -> list[JsonObject]:
    system = body.get("system")
    blocks = system if isinstance(system, list) else [{"text": system}] if system else []
    messages: list[JsonObject] = [
        {"role": "system", "content": text_of([block])} for block in blocks
    ]
    for wire in body.get("messages") or ():
        content = wire.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if wire.get("role") == "assistant":
            message: JsonObject = {"role": "assistant"}
            texts = [p for p in parts if p.get("type") == "text" and p.get("text")]
            calls = [p for p in parts if p.get("type") == "tool_use"]
            thinking = [p["thinking"] for p in parts if p.get("type") == "thinking"]
            message["content"] = text_of(texts) if texts or not calls else None
            if thinking:
                message["reasoning_content"] = "".join(thinking)
            if calls:
                message["tool_calls"] = [
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {
                            "name": call.get("name"),
                            "arguments": orjson.dumps(call.get("input")).decode(),
                        },
                    }
                    for call in calls
                ]
            messages.append(message)
            continue
        for part in parts:
            if part.get("type") == "tool_result":
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": part.get("tool_use_id"),
                        "content": text_of(part.get("content")),
                    }
                )
            else:
                messages.append({"role": "user", "content": text_of([part])})
    return messages


def _anthropic_pairs(body: JsonObject) -> set[str]:
    """A tool_use is answered when the next message is a user message holding its result."""
    wire = [m for m in body.get("messages") or () if isinstance(m, dict)]
    paired: set[str] = set()
    for current, following in itertools.pairwise(wire):
        if current.get("role") != "assistant" or following.get("role") != "user":
            continue
        calls = {
            str(b.get("id"))
            for b in current.get("content") or ()
            if isinstance(b, dict) and b.get("type") == "tool_use"
        }
        results = {
            str(b.get("tool_use_id"))
            for b in following.get("content") or ()
            if isinstance(b, dict) and b.get("type") == "tool_result"
        }
        paired |= calls & results
    return paired


# --- OpenAI Responses --------------------------------------------------------------------------


def _responses_items(message: JsonObject) -> list[JsonObject]:
    role = message.get("role")
    if role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": message.get("tool_call_id"),
                "output": text_of(message.get("content")),
            }
        ]
    if role != "assistant":
        kind = "input_text"
        wire_role = "developer" if role in ("system", "developer") else "user"
        return [
            {
                "type": "message",
                "role": wire_role,
                "content": [{"type": kind, "text": text_of(message.get("content"))}],
            }
        ]
    items: list[JsonObject] = []
    if reasoning := message.get("reasoning_content"):
        items.append(
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reasoning}],
                "encrypted_content": opaque("enc", reasoning),
            }
        )
    text = text_of(message.get("content"))
    if text or not (items or message.get("tool_calls")):  # an empty reply is still a message
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text}],
            }
        )
    for call in tool_calls(message):
        function = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "call_id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments") or "",
            }
        )
    return items


def _responses(messages: list[JsonObject], tools: list[JsonObject]) -> JsonObject:
    head = _leading_system(messages)
    body: JsonObject = {"model": "replay"}
    if head:
        body["instructions"] = "\n\n".join(text_of(m.get("content")) for m in messages[:head])
    body["input"] = [item for message in messages[head:] for item in _responses_items(message)]
    if tools:
        body["tools"] = [
            {
                "type": "function",
                "name": _function(tool).get("name"),
                "description": _function(tool).get("description") or "",
                "parameters": _schema(tool),
            }
            for tool in tools
        ]
    body["store"] = False
    return body


def _chat_from_responses(body: JsonObject) -> list[JsonObject]:
    messages: list[JsonObject] = []
    if "instructions" in body:
        messages.append({"role": "system", "content": text_of(body["instructions"])})
    assistant: JsonObject | None = None

    def open_assistant() -> JsonObject:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": None}
            messages.append(assistant)
        return assistant

    for item in body.get("input") or ():
        kind = item.get("type")
        if kind == "reasoning":
            if assistant is not None and (assistant["content"] or assistant.get("tool_calls")):
                assistant = None  # a new assistant message starts with its reasoning
            summary = text_of(item.get("summary"))
            open_assistant()["reasoning_content"] = summary
        elif kind == "function_call":
            open_assistant().setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        elif kind == "function_call_output":
            assistant = None
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": text_of(item.get("output")),
                }
            )
        elif item.get("role") == "assistant":
            current = open_assistant()
            if current["content"] or current.get("tool_calls"):
                assistant = None
                current = open_assistant()
            current["content"] = text_of(item.get("content"))
        else:
            assistant = None
            role = "system" if item.get("role") == "developer" else "user"
            messages.append({"role": role, "content": text_of(item.get("content"))})
    return messages


def _responses_pairs(body: JsonObject) -> set[str]:
    """A function_call is answered by a later function_call_output with its call_id."""
    calls: set[str] = set()
    paired: set[str] = set()
    for item in body.get("input") or ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.add(str(item.get("call_id")))
        elif item.get("type") == "function_call_output" and str(item.get("call_id")) in calls:
            paired.add(str(item.get("call_id")))
    return paired


# --- chat, and the entry points ----------------------------------------------------------------


def _chat_pairs(body: JsonObject) -> set[str]:
    messages = [m for m in body.get("messages") or () if isinstance(m, dict)]
    calls = {
        str(call.get("id"))
        for message in messages
        if message.get("role") == "assistant"
        for call in tool_calls(message)
        if isinstance(call, dict)
    }
    return calls & {str(m.get("tool_call_id")) for m in messages if m.get("role") == "tool"}


def request_body(dialect: str, messages: list[JsonObject], tools: list[JsonObject]) -> JsonObject:
    """The body a client of ``dialect`` sends for these chat messages (copied, never shared)."""
    messages = orjson.loads(orjson.dumps(messages))
    tools = orjson.loads(orjson.dumps(tools))
    if dialect == "anthropic":
        return _anthropic(messages, tools)
    if dialect == "responses":
        return _responses(messages, tools)
    body: JsonObject = {"model": "replay", "messages": messages}
    if tools:
        body["tools"] = tools
    return body


def to_chat(dialect: str, body: JsonObject) -> list[JsonObject]:
    """Chat messages of a body of ``dialect`` (the inverse of ``request_body``)."""
    if dialect == "anthropic":
        return _chat_from_anthropic(body)
    if dialect == "responses":
        return _chat_from_responses(body)
    return list(body.get("messages") or ())


def payload(dialect: str, body: JsonObject) -> list[Any]:
    """What the provider tokenises, one entry per wire message (the system part first)."""
    if dialect == "anthropic":
        head = [{"system": body["system"]}] if "system" in body else []
        return without_cache_marks(head + list(body.get("messages") or ()))
    if dialect == "responses":
        head = [{"instructions": body["instructions"]}] if "instructions" in body else []
        return head + list(body.get("input") or ())
    return list(body.get("messages") or ())


def paired_calls(dialect: str, body: JsonObject) -> set[str]:
    """Ids of the tool calls answered as the dialect's rules require."""
    if dialect == "anthropic":
        return _anthropic_pairs(body)
    if dialect == "responses":
        return _responses_pairs(body)
    return _chat_pairs(body)
