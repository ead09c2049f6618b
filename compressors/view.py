"""Views over the three chat wire formats.

A view never rebuilds a request. It walks the parsed body once and yields ``Item``s, each
pointing at the exact JSON container and key its text came from, so an edit is a single
assignment into the original structure and every unknown field, key order and provider extra
survives serialisation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from compressors import jsontext

JsonObject = dict[str, Any]


class UnrecognisedBody(ValueError):
    """JSON that is not a chat body of the dialect, or one with a field of a shape the view
    does not understand (a message that is not an object, ``tool_calls`` that is not a list, a
    ``content`` that is neither text nor a list of parts...). The proxy relays such a body
    unchanged and lets the provider answer it."""


class Dialect(StrEnum):
    OPENAI_CHAT = "openai-chat"
    ANTHROPIC = "anthropic"
    OPENAI_RESPONSES = "openai-responses"


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Kind(StrEnum):
    TEXT = "text"
    REASONING = "reasoning"
    TOOL_CALL = "tool_call"
    TOOL_RESULT = "tool_result"


@dataclass(slots=True)
class Item:
    """One piece of conversation text and the place in the body it lives.

    ``holder[key]`` is the value; ``message`` is the index of the wire message (or input item)
    it belongs to, -1 for a top-level system prompt (Anthropic ``system``, Responses
    ``instructions``).
    """

    kind: Kind
    role: Role
    message: int
    holder: Any
    key: str | int
    call_id: str | None = None
    tool_name: str | None = None

    @property
    def value(self) -> Any:
        return self.holder[self.key]

    @property
    def text(self) -> str:
        """The item's text; tool-call arguments given as objects are serialised."""
        value = self.holder[self.key]
        if isinstance(value, str):
            return value
        if value is None:
            return ""
        return jsontext.dumps(value).decode()

    def set_text(self, text: str) -> None:
        self.holder[self.key] = text


@dataclass(slots=True)
class Conversation:
    """A parsed chat request body and the items found in it, in wire order."""

    dialect: Dialect
    body: JsonObject
    items: list[Item] = field(default_factory=list)
    last_user_message: int = -1

    @property
    def has_tools(self) -> bool:
        return bool(self.body.get("tools"))

    def texts(self, role: Role, kind: Kind = Kind.TEXT) -> Iterator[str]:
        for item in self.items:
            if item.role is role and item.kind is kind:
                yield item.text

    @property
    def system_text(self) -> str:
        return "\n".join(self.texts(Role.SYSTEM))

    def user_message_texts(self) -> list[str]:
        """The text of each user message that carries text (tool results excluded)."""
        by_message: dict[int, list[str]] = {}
        for item in self.items:
            if item.role is Role.USER and item.kind is Kind.TEXT:
                by_message.setdefault(item.message, []).append(item.text)
        return ["\n".join(parts) for _, parts in sorted(by_message.items())]

    def count(self, kind: Kind) -> int:
        return sum(1 for item in self.items if item.kind is kind)

    def user_messages(self) -> list[tuple[int, str]]:
        """``(message index, text)`` of each user message that starts a turn, in order.

        For Anthropic a user message that carries tool results continues the tool loop, so it
        is left out even when the client put text beside the results.
        """
        by_message: dict[int, list[str]] = {}
        carries_results: set[int] = set()
        user, text, result = Role.USER, Kind.TEXT, Kind.TOOL_RESULT
        for item in self.items:  # one pass: this runs on every request
            if item.kind is result:
                carries_results.add(item.message)
            elif item.role is user and item.kind is text:
                by_message.setdefault(item.message, []).append(item.text)
        return [
            (index, "\n".join(parts))
            for index, parts in sorted(by_message.items())
            if index not in carries_results
        ]

    def drop_entries(self, indices: set[int]) -> int:
        """Remove Responses ``input`` entries, renumbering the items that remain."""
        entries = self.body.get("input")
        if self.dialect is not Dialect.OPENAI_RESPONSES or not isinstance(entries, list):
            return 0
        doomed = {i for i in indices if 0 <= i < len(entries)}
        if not doomed:
            return 0
        kept = [i for i in range(len(entries)) if i not in doomed]
        entries[:] = [entries[i] for i in kept]
        renumber = {old: new for new, old in enumerate(kept)}
        self.items[:] = [item for item in self.items if item.message not in doomed]
        for item in self.items:
            if item.message >= 0:
                item.message = renumber[item.message]
        if self.last_user_message in doomed:
            self.last_user_message = max(
                (i for i in kept if i < self.last_user_message), default=-1
            )
        if self.last_user_message >= 0:
            self.last_user_message = renumber.get(self.last_user_message, -1)
        return len(doomed)

    def append_to_system(self, text: str) -> bool:
        """Add ``text`` after the system prompt; False when the request has none to extend.

        The added text comes after every existing byte of the prompt and carries no
        ``cache_control``, so an Anthropic breakpoint count never grows.
        """
        body = self.body
        if self.dialect is Dialect.ANTHROPIC:
            if "system" not in body or body["system"] in (None, ""):
                body["system"] = text
                return True
            return _append_content(body, "system", text, "text")
        if self.dialect is Dialect.OPENAI_RESPONSES:
            if isinstance(body.get("instructions"), str) and body["instructions"]:
                body["instructions"] += "\n\n" + text
                return True
            entries = body.get("input")
            holder_list = entries if isinstance(entries, list) else []
            kind = "input_text"
        else:
            holder_list = body.get("messages") or []
            kind = "text"
        last_system = None
        for message in holder_list:
            if not isinstance(message, dict) or message.get("role") not in ("system", "developer"):
                break
            last_system = message
        if last_system is None or "content" not in last_system:
            return False
        return _append_content(last_system, "content", text, kind)

    def append_to_message(self, index: int, text: str) -> bool:
        """Add ``text`` at the end of wire message ``index`` (a user message)."""
        body = self.body
        if self.dialect is Dialect.OPENAI_RESPONSES:
            entries = body.get("input")
            if isinstance(entries, str):
                body["input"] = entries + "\n\n" + text
                return True
            holder_list, kind = entries if isinstance(entries, list) else [], "input_text"
        else:
            holder_list, kind = body.get("messages") or [], "text"
        if not 0 <= index < len(holder_list) or not isinstance(holder_list[index], dict):
            return False
        return _append_content(holder_list[index], "content", text, kind)


def _append_content(holder: JsonObject, key: str, text: str, part_type: str) -> bool:
    """Append to a string content, or add a typed text part to a list of parts."""
    value = holder.get(key)
    if isinstance(value, str):
        holder[key] = value + "\n\n" + text if value else text
        return True
    if isinstance(value, list):
        value.append({"type": part_type, "text": text})
        return True
    return False


def parse_conversation(dialect: Dialect, body: object) -> Conversation:
    """Build the view of a parsed request body; raise ``UnrecognisedBody`` if it is not a chat
    body of ``dialect`` or has a field of a shape the view does not understand."""
    if not isinstance(body, dict):
        raise UnrecognisedBody("request body is not a JSON object")
    if not isinstance(body.get("tools", []), list | None):
        raise UnrecognisedBody("'tools' is not a list")
    conversation = Conversation(dialect, body)
    if dialect is Dialect.OPENAI_CHAT:
        _walk_openai_chat(conversation)
    elif dialect is Dialect.ANTHROPIC:
        _walk_anthropic(conversation)
    else:
        _walk_responses(conversation)
    return conversation


def _text_parts(
    out: list[Item], role: Role, kind: Kind, message: int, holder: Any, key: str | int
) -> None:
    """Items for a ``content`` that is a string or a list of typed text parts."""
    if key not in holder:
        raise UnrecognisedBody(f"{_where(message)} has no {key!r}")
    value = holder[key]
    if isinstance(value, str):
        out.append(Item(kind, role, message, holder, key))
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(Item(kind, role, message, part, "text"))
    elif value is not None:
        raise UnrecognisedBody(f"{key!r} of {_where(message)} is neither text nor a list of parts")


def _where(message: int) -> str:
    return "the system prompt" if message < 0 else f"message {message}"


def _message_object(index: int, message: object) -> JsonObject:
    if not isinstance(message, dict):
        raise UnrecognisedBody(f"message {index} is not an object")
    return message


def _walk_openai_chat(conversation: Conversation) -> None:
    messages = conversation.body.get("messages")
    if not isinstance(messages, list):
        raise UnrecognisedBody("chat completions body has no 'messages' list")
    items = conversation.items
    call_names: dict[str, str] = {}
    for index, entry in enumerate(messages):
        message = _message_object(index, entry)
        role_name = message.get("role")
        if not isinstance(role_name, str):
            raise UnrecognisedBody(f"message {index} has no 'role' text")
        if role_name in ("system", "developer"):
            if "content" in message:
                _text_parts(items, Role.SYSTEM, Kind.TEXT, index, message, "content")
        elif role_name == "user":
            conversation.last_user_message = index
            if "content" in message:
                _text_parts(items, Role.USER, Kind.TEXT, index, message, "content")
        elif role_name == "assistant":
            for key in ("reasoning_content", "reasoning"):
                if isinstance(message.get(key), str):
                    items.append(Item(Kind.REASONING, Role.ASSISTANT, index, message, key))
            if "content" in message:
                _text_parts(items, Role.ASSISTANT, Kind.TEXT, index, message, "content")
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
                        Item(
                            Kind.TOOL_CALL,
                            Role.ASSISTANT,
                            index,
                            function,
                            "arguments",
                            call_id,
                            name,
                        )
                    )
        elif role_name in ("tool", "function"):
            call_id = str(message.get("tool_call_id", ""))
            named = message.get("name")
            tool_name = call_names.get(call_id) or (named if isinstance(named, str) else None)
            start = len(items)
            if "content" in message:
                _text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, message, "content")
            for item in items[start:]:
                item.call_id, item.tool_name = call_id, tool_name


def _walk_anthropic(conversation: Conversation) -> None:
    body = conversation.body
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise UnrecognisedBody("messages body has no 'messages' list")
    items = conversation.items
    if "system" in body:
        _text_parts(items, Role.SYSTEM, Kind.TEXT, -1, body, "system")
    call_names: dict[str, str] = {}
    for index, entry in enumerate(messages):
        message = _message_object(index, entry)
        content = message.get("content")
        if not isinstance(content, str | list):
            raise UnrecognisedBody(f"'content' of message {index} is neither text nor a list")
        if isinstance(content, list) and not all(
            isinstance(block, dict) and isinstance(block.get("type"), str) for block in content
        ):
            raise UnrecognisedBody(f"a content block of message {index} has no 'type' text")
        if message.get("role") == "user":
            if isinstance(content, str):
                items.append(Item(Kind.TEXT, Role.USER, index, message, "content"))
                conversation.last_user_message = index
                continue
            blocks = content if isinstance(content, list) else []
            # A message that carries tool results continues the tool loop, even when the
            # client added text beside them; only a message without results starts a turn.
            types = {block["type"] for block in blocks}
            if "text" in types and "tool_result" not in types:
                conversation.last_user_message = index
            for block in blocks:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and isinstance(block.get("text"), str):
                    items.append(Item(Kind.TEXT, Role.USER, index, block, "text"))
                elif block.get("type") == "tool_result" and "content" in block:
                    call_id = str(block.get("tool_use_id", ""))
                    start = len(items)
                    _text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, block, "content")
                    for item in items[start:]:
                        item.call_id, item.tool_name = call_id, call_names.get(call_id)
        elif message.get("role") == "assistant":
            if isinstance(content, str):
                items.append(Item(Kind.TEXT, Role.ASSISTANT, index, message, "content"))
                continue
            for block in content if isinstance(content, list) else ():
                if not isinstance(block, dict):
                    continue
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
                    items.append(
                        Item(Kind.TOOL_CALL, Role.ASSISTANT, index, block, "input", call_id, name)
                    )


def _walk_responses(conversation: Conversation) -> None:
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
    call_names: dict[str, str] = {}
    for index, value in enumerate(entries):
        entry = _message_object(index, value)
        kind = entry.get("type", "message")
        if kind == "message":
            role = entry.get("role")
            if role in ("system", "developer"):
                _text_parts(items, Role.SYSTEM, Kind.TEXT, index, entry, "content")
            elif role == "user":
                conversation.last_user_message = index
                _text_parts(items, Role.USER, Kind.TEXT, index, entry, "content")
            elif role == "assistant":
                _text_parts(items, Role.ASSISTANT, Kind.TEXT, index, entry, "content")
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
            _text_parts(items, Role.TOOL, Kind.TOOL_RESULT, index, entry, "output")
            for item in items[start:]:
                item.call_id, item.tool_name = call_id, call_names.get(call_id)
