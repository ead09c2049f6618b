"""OpenAI chat completions (``POST …/chat/completions``), and every provider that speaks it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from compressors.view import Conversation, Dialect, Item, Kind, Role, UnrecognisedBody, Walked
from compressors.wire.base import (
    JsonObject,
    Usage,
    append_to_entry,
    count,
    list_length,
    listed,
    message_object,
    text_parts,
)

_SYSTEM_ROLES = ("system", "developer")


class OpenAIChat:
    dialect = Dialect.OPENAI_CHAT
    path_suffix = "/chat/completions"
    usage_marker = b'usage"'
    messages_key = "messages"
    edited_members: frozenset[str] = frozenset()
    user_message_bytes: bytes | None = b'"role":"user"'

    def messages(self, body: JsonObject) -> list[Any]:
        return listed(body, "messages")

    def walk(self, conversation: Conversation, known: Walked | None = None) -> None:
        messages = conversation.body.get("messages")
        if not isinstance(messages, list):
            raise UnrecognisedBody("chat completions body has no 'messages' list")
        items = conversation.items
        first, call_names = conversation.begin_walk(messages, known)
        for index in conversation.walk_indices(first, len(messages), call_names):
            message = message_object(index, messages[index])
            role_name = message.get("role")
            if not isinstance(role_name, str):
                raise UnrecognisedBody(f"message {index} has no 'role' text")
            if role_name in _SYSTEM_ROLES:
                if "content" in message:
                    text_parts(items, Role.SYSTEM, Kind.TEXT, index, message, "content")
            elif role_name == "user":
                conversation.last_user_message = index
                if "content" in message:
                    text_parts(items, Role.USER, Kind.TEXT, index, message, "content")
            elif role_name == "assistant":
                _assistant(items, index, message, call_names)
            elif role_name in ("tool", "function"):
                call_id = str(message.get("tool_call_id", ""))
                named = message.get("name")
                tool_name = call_names.get(call_id) or (named if isinstance(named, str) else None)
                start = len(items)
                if "content" in message:
                    text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, message, "content")
                for item in items[start:]:
                    item.call_id, item.tool_name = call_id, tool_name
        conversation.end_walk(messages, call_names)

    def append_to_system(self, conversation: Conversation, text: str) -> bool:
        return append_to_leading_system(conversation, text, "text")

    def append_to_message(self, conversation: Conversation, index: int, text: str) -> bool:
        return append_to_entry(conversation, index, text, "text")

    def drop_reasoning(self, conversation: Conversation, items: list[Item]) -> int:
        for item in items:
            conversation.remove_value(item)
        dropped = {id(item) for item in items}
        conversation.items[:] = [item for item in conversation.items if id(item) not in dropped]
        return len(items)

    def tool_names(self, body: JsonObject) -> list[str]:
        names = []
        for tool in body.get("tools") or ():
            if isinstance(tool, dict):
                function = tool.get("function")
                holder = function if isinstance(function, dict) else tool
                if isinstance(holder.get("name"), str):
                    names.append(holder["name"])
        return names

    def history_messages(self, body: JsonObject) -> list[Any]:
        return list(body.get("messages") or [])

    def message_count(self, body: JsonObject) -> int:
        return list_length(body.get("messages"))

    def owns_path(self, subpath: str, headers: Mapping[str, str]) -> bool:
        return False  # the default shape: any call no other format claims gets it

    def error_body(self, message: str, error_type: str, code: str) -> bytes:
        return openai_error_body(message, error_type, code)

    def sse_error_event(self, message: str) -> bytes:
        error = self.error_body(message, "upstream_error", "upstream_stream_interrupted")
        return b"data: " + error + b"\n\n"

    def read_usage(self, usage: Usage, event: JsonObject) -> bool:
        raw = event.get("usage")
        if not isinstance(raw, dict) or "prompt_tokens" not in raw:
            return False
        usage.input_tokens = count(raw.get("prompt_tokens"))
        usage.output_tokens = count(raw.get("completion_tokens"))
        details = raw.get("prompt_tokens_details")
        if isinstance(details, dict):
            usage.cache_read_tokens = count(details.get("cached_tokens"))
        return True


def _assistant(
    items: list[Item], index: int, message: JsonObject, call_names: dict[str, str]
) -> None:
    for key in ("reasoning_content", "reasoning"):
        if isinstance(message.get(key), str):
            items.append(Item(Kind.REASONING, Role.ASSISTANT, index, message, key))
    if "content" in message:
        text_parts(items, Role.ASSISTANT, Kind.TEXT, index, message, "content")
    calls = message.get("tool_calls")
    if not isinstance(calls, list | None):
        raise UnrecognisedBody(f"'tool_calls' of message {index} is not a list")
    for call in calls or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and "arguments" in function:
            call_id = str(call.get("id", ""))
            name = str(function.get("name", ""))
            call_names[call_id] = name
            items.append(
                Item(Kind.TOOL_CALL, Role.ASSISTANT, index, function, "arguments", call_id, name)
            )


# --- shared with OpenAI Responses, which keeps the same conventions -----------------------------


def append_to_leading_system(conversation: Conversation, text: str, part_type: str) -> bool:
    """Append to the last of the system (or developer) messages the list begins with."""
    last_system = -1
    for index, message in enumerate(conversation.wire.messages(conversation.body)):
        if not isinstance(message, dict) or message.get("role") not in _SYSTEM_ROLES:
            break
        last_system = index
    return last_system >= 0 and append_to_entry(conversation, last_system, text, part_type)


def openai_error_body(message: str, error_type: str, code: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": error_type, "code": code}})


FORMAT = OpenAIChat()
