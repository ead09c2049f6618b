"""Anthropic messages (``POST …/messages``): a top-level ``system``, content blocks, signed
thinking that may only be dropped whole."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from compressors.view import Conversation, Dialect, Item, Kind, Role, UnrecognisedBody, Walked
from compressors.wire.base import (
    JsonObject,
    Usage,
    append_content,
    append_to_entry,
    count,
    list_length,
    listed,
    message_object,
    text_parts,
)

_USAGE_EVENTS = frozenset({"message_start", "message_delta", "message"})


class Anthropic:
    dialect = Dialect.ANTHROPIC
    path_suffix = "/messages"
    usage_marker = b'usage"'
    messages_key = "messages"
    edited_members = frozenset({"system"})
    user_message_bytes: bytes | None = None  # tool results are user messages

    def messages(self, body: JsonObject) -> list[Any]:
        return listed(body, "messages")

    def walk(self, conversation: Conversation, known: Walked | None = None) -> None:
        body = conversation.body
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise UnrecognisedBody("messages body has no 'messages' list")
        items = conversation.items
        if "system" in body:
            text_parts(items, Role.SYSTEM, Kind.TEXT, -1, body, "system")
        first, call_names = conversation.begin_walk(messages, known)
        for index in conversation.walk_indices(first, len(messages), call_names):
            message = message_object(index, messages[index])
            content = message.get("content")
            if not isinstance(content, str | list):
                raise UnrecognisedBody(f"'content' of message {index} is neither text nor a list")
            if isinstance(content, list) and not all(
                isinstance(block, dict) and isinstance(block.get("type"), str) for block in content
            ):
                raise UnrecognisedBody(f"a content block of message {index} has no 'type' text")
            if message.get("role") == "user":
                _user(conversation, index, message, content, call_names)
            elif message.get("role") == "assistant":
                _assistant(items, index, message, content, call_names)
        conversation.end_walk(messages, call_names)

    def append_to_system(self, conversation: Conversation, text: str) -> bool:
        # The added text carries no cache_control, so the breakpoint count never grows.
        body = conversation.body
        if "system" not in body or body["system"] in (None, ""):
            body["system"] = text
            return True
        return append_content(body, "system", text, "text")

    def append_to_message(self, conversation: Conversation, index: int, text: str) -> bool:
        return append_to_entry(conversation, index, text, "text")

    def drop_reasoning(self, conversation: Conversation, items: list[Item]) -> int:
        messages = conversation.body["messages"]
        dropped: set[int] = set()
        for item in items:
            content = messages[item.message].get("content")
            # A message of nothing but thinking keeps it: an empty content is not allowed.
            if isinstance(content, list) and any(b is not item.holder for b in content):
                conversation.remove_part(item, item.message, "content")
                dropped.add(id(item))
        conversation.items[:] = [item for item in conversation.items if id(item) not in dropped]
        return len(dropped)

    def tool_names(self, body: JsonObject) -> list[str]:
        return [
            tool["name"]
            for tool in body.get("tools") or ()
            if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        ]

    def history_messages(self, body: JsonObject) -> list[Any]:
        system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
        return system + list(body.get("messages") or [])

    def message_count(self, body: JsonObject) -> int:
        return list_length(body.get("messages"))

    def owns_path(self, subpath: str, headers: Mapping[str, str]) -> bool:
        return "/messages" in subpath or "anthropic-version" in headers

    def error_body(self, message: str, error_type: str, code: str) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})

    def sse_error_event(self, message: str) -> bytes:
        error = self.error_body(message, "api_error", "upstream_stream_interrupted")
        return b"event: error\ndata: " + error + b"\n\n"

    def read_usage(self, usage: Usage, event: JsonObject) -> bool:
        kind = event.get("type")
        if kind not in _USAGE_EVENTS:
            return False
        if kind == "message_start":
            message = event.get("message")
            if not isinstance(message, dict):
                return False
            raw = message.get("usage")
        else:  # message_delta, and a whole answer (not streamed)
            raw = event.get("usage")
        if not isinstance(raw, dict):
            return False
        if "input_tokens" in raw or "cache_read_input_tokens" in raw:
            usage.cache_read_tokens = count(raw.get("cache_read_input_tokens"))
            usage.cache_write_tokens = count(raw.get("cache_creation_input_tokens"))
            usage.input_tokens = (
                count(raw.get("input_tokens")) + usage.cache_read_tokens + usage.cache_write_tokens
            )
        if "output_tokens" in raw:
            usage.output_tokens = count(raw.get("output_tokens"))
        return True


def _user(
    conversation: Conversation,
    index: int,
    message: JsonObject,
    content: str | list[Any],
    call_names: dict[str, str],
) -> None:
    items = conversation.items
    if isinstance(content, str):
        items.append(Item(Kind.TEXT, Role.USER, index, message, "content"))
        conversation.last_user_message = index
        return
    # A message that carries tool results continues the tool loop, even when the client added
    # text beside them; only a message without results starts a turn.
    types = {block["type"] for block in content}
    if "text" in types and "tool_result" not in types:
        conversation.last_user_message = index
    for block in content:
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            items.append(Item(Kind.TEXT, Role.USER, index, block, "text"))
        elif block.get("type") == "tool_result" and "content" in block:
            call_id = str(block.get("tool_use_id", ""))
            start = len(items)
            text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, block, "content")
            for item in items[start:]:
                item.call_id, item.tool_name = call_id, call_names.get(call_id)


def _assistant(
    items: list[Item],
    index: int,
    message: JsonObject,
    content: str | list[Any],
    call_names: dict[str, str],
) -> None:
    if isinstance(content, str):
        items.append(Item(Kind.TEXT, Role.ASSISTANT, index, message, "content"))
        return
    for block in content:
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            items.append(Item(Kind.TEXT, Role.ASSISTANT, index, block, "text"))
        elif kind == "thinking" and "thinking" in block:
            items.append(Item(Kind.REASONING, Role.ASSISTANT, index, block, "thinking"))
        elif kind == "redacted_thinking" and "data" in block:
            items.append(Item(Kind.REASONING, Role.ASSISTANT, index, block, "data"))
        elif kind == "tool_use" and "input" in block:
            call_id, name = str(block.get("id", "")), str(block.get("name", ""))
            call_names[call_id] = name
            items.append(Item(Kind.TOOL_CALL, Role.ASSISTANT, index, block, "input", call_id, name))


FORMAT = Anthropic()
