"""OpenAI Responses (``POST …/responses``): ``instructions``, an ``input`` string or list of typed
items, reasoning as items of their own (with ``encrypted_content`` never edited)."""

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
from compressors.wire.openai_chat import append_to_leading_system, openai_error_body

_FINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class OpenAIResponses:
    dialect = Dialect.OPENAI_RESPONSES
    path_suffix = "/responses"
    usage_marker = b'usage"'
    messages_key = "input"
    edited_members = frozenset({"instructions"})
    user_message_bytes: bytes | None = b'"role":"user"'

    def messages(self, body: JsonObject) -> list[Any]:
        return listed(body, "input")

    def walk(self, conversation: Conversation, known: Walked | None = None) -> None:
        body = conversation.body
        items = conversation.items
        if isinstance(body.get("instructions"), str):
            items.append(Item(Kind.TEXT, Role.SYSTEM, -1, body, "instructions"))
        entries = body.get("input")
        if isinstance(entries, str):
            items.append(Item(Kind.TEXT, Role.USER, 0, body, "input"))
            conversation.last_user_message = 0
            return
        if not isinstance(entries, list):
            raise UnrecognisedBody("responses body has no 'input'")
        first, call_names = conversation.begin_walk(entries, known)
        for index in conversation.walk_indices(first, len(entries), call_names):
            entry = message_object(index, entries[index])
            kind = entry.get("type", "message")
            if kind == "message":
                role = entry.get("role")
                if role in ("system", "developer"):
                    text_parts(items, Role.SYSTEM, Kind.TEXT, index, entry, "content")
                elif role == "user":
                    conversation.last_user_message = index
                    text_parts(items, Role.USER, Kind.TEXT, index, entry, "content")
                elif role == "assistant":
                    text_parts(items, Role.ASSISTANT, Kind.TEXT, index, entry, "content")
            elif kind == "reasoning":
                key = "summary" if "summary" in entry else "encrypted_content"
                if key not in entry:
                    raise UnrecognisedBody(f"reasoning item {index} has no summary")
                items.append(Item(Kind.REASONING, Role.ASSISTANT, index, entry, key))
            elif kind == "function_call" and "arguments" in entry:
                call_id, name = str(entry.get("call_id", "")), str(entry.get("name", ""))
                call_names[call_id] = name
                items.append(
                    Item(Kind.TOOL_CALL, Role.ASSISTANT, index, entry, "arguments", call_id, name)
                )
            elif kind == "function_call_output" and "output" in entry:
                call_id = str(entry.get("call_id", ""))
                start = len(items)
                text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, entry, "output")
                for item in items[start:]:
                    item.call_id, item.tool_name = call_id, call_names.get(call_id)
        conversation.end_walk(entries, call_names)

    def append_to_system(self, conversation: Conversation, text: str) -> bool:
        body = conversation.body
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            body["instructions"] += "\n\n" + text
            return True
        return append_to_leading_system(conversation, text, "input_text")

    def append_to_message(self, conversation: Conversation, index: int, text: str) -> bool:
        body = conversation.body
        entries = body.get("input")
        if isinstance(entries, str):
            body["input"] = entries + "\n\n" + text
            return True
        return append_to_entry(conversation, index, text, "input_text")

    def drop_reasoning(self, conversation: Conversation, items: list[Item]) -> int:
        """Reasoning is an input item of its own: the whole item goes, and the view's message
        indices are renumbered to match the shorter list."""
        entries = conversation.body.get("input")
        if not isinstance(entries, list):
            return 0
        doomed = {item.message for item in items if 0 <= item.message < len(entries)}
        if not doomed:
            return 0
        kept = [i for i in range(len(entries)) if i not in doomed]
        conversation.removed_messages = sorted(
            [*conversation.removed_messages, *map(conversation.arrived_index, doomed)]
        )
        entries[:] = [entries[i] for i in kept]
        renumber = {old: new for new, old in enumerate(kept)}
        conversation.items[:] = [item for item in conversation.items if item.message not in doomed]
        for item in conversation.items:
            if item.message >= 0:
                item.message = renumber[item.message]
        last_user = conversation.last_user_message
        if last_user in doomed:
            last_user = max((i for i in kept if i < last_user), default=-1)
        conversation.last_user_message = (
            renumber.get(last_user, -1) if last_user >= 0 else last_user
        )
        return len(doomed)

    def tool_names(self, body: JsonObject) -> list[str]:
        return [
            tool["name"]
            for tool in body.get("tools") or ()
            if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        ]

    def history_messages(self, body: JsonObject) -> list[Any]:
        entries = body.get("input")
        messages = entries if isinstance(entries, list) else [{"role": "user", "content": entries}]
        instructions = body.get("instructions")
        return ([{"role": "system", "content": instructions}] if instructions else []) + messages

    def message_count(self, body: JsonObject) -> int:
        return list_length(body.get("input"))

    def owns_path(self, subpath: str, headers: Mapping[str, str]) -> bool:
        return False  # its other calls take the OpenAI shape, which chat's errors already have

    def error_body(self, message: str, error_type: str, code: str) -> bytes:
        return openai_error_body(message, error_type, code)

    def sse_error_event(self, message: str) -> bytes:
        error = {"type": "error", "code": "upstream_stream_interrupted", "message": message}
        return b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"

    def read_usage(self, usage: Usage, event: JsonObject) -> bool:
        if event.get("type") in _FINAL_EVENTS and isinstance(event.get("response"), dict):
            raw = event["response"].get("usage")
        elif event.get("object") == "response":  # a whole answer, not streamed
            raw = event.get("usage")
        else:
            return False
        if not isinstance(raw, dict):
            return False
        usage.input_tokens = count(raw.get("input_tokens"))
        usage.output_tokens = count(raw.get("output_tokens"))
        details = raw.get("input_tokens_details")
        if isinstance(details, dict):
            usage.cache_read_tokens = count(details.get("cached_tokens"))
        return True


FORMAT = OpenAIResponses()
