"""The view of a chat request, the same for every wire format.

A view never rebuilds a request. Its wire format (``compressors/wire/``) walks the parsed body
once and yields ``Item``s, each pointing at the exact JSON container and key its text came
from, so an edit is a single assignment into the original structure and every unknown field,
key order and provider extra survives serialisation.

Every edit goes through the ``Conversation`` (``set_text``, ``set_value``, ``writable``, the
appends and ``drop_reasoning``). Messages it was told are shared (``share_messages``: parsed
objects a cache hands to the next request of the session too) are copied before their first
edit, container by container, and the items pointing into them follow the copy; the shared
objects themselves are never changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from compressors import jsontext

if TYPE_CHECKING:  # the formats build views; a view only calls back into its own format
    from compressors.wire.base import WireFormat

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


@dataclass(slots=True)
class Conversation:
    """A parsed chat request body and the items found in it, in wire order."""

    wire: WireFormat
    body: JsonObject
    items: list[Item] = field(default_factory=list)
    last_user_message: int = -1
    # Indices, as the client sent them, of the wire messages removed whole (Responses
    # reasoning items), ascending: the messages after them are renumbered.
    removed_messages: list[int] = field(default_factory=list)
    _shared: set[int] = field(default_factory=set)  # ids of messages to copy before an edit
    _by_holder: dict[int, list[Item]] | None = None  # items by id(holder), built on first copy

    def share_messages(self) -> None:
        """Treat every wire message as shared with other requests: copy it before editing."""
        messages = self.wire.messages(self.body)
        self._shared = {id(message) for message in messages}

    def writable(self, index: int) -> Any:
        """Wire message ``index`` (of the body as it is now), safe to change in place."""
        messages = self.wire.messages(self.body)
        message = messages[index]
        if id(message) not in self._shared:
            return message
        copies: dict[int, Any] = {}
        copy = _copy_containers(message, copies)
        messages[index] = copy
        self._shared.discard(id(message))
        by_holder = self._holders()
        for old, new in copies.items():
            moved = by_holder.pop(old, None)
            if moved:
                for item in moved:
                    item.holder = new
                by_holder[id(new)] = moved
        return copy

    def set_text(self, item: Item, text: str) -> None:
        self.set_value(item, text)

    def set_value(self, item: Item, value: Any) -> None:
        """Replace the item's value (a tool call's arguments keep their wire shape)."""
        if item.message >= 0 and self._shared:
            self.writable(item.message)
        item.holder[item.key] = value

    def _holders(self) -> dict[int, list[Item]]:
        if self._by_holder is None:
            self._by_holder = {}
            for item in self.items:
                self._by_holder.setdefault(id(item.holder), []).append(item)
        return self._by_holder

    def arrived_index(self, message: int) -> int:
        """The index wire message ``message`` (of the body as it is now) had as it arrived."""
        for removed in self.removed_messages:
            if removed > message:
                break
            message += 1
        return message

    @property
    def dialect(self) -> Dialect:
        return self.wire.dialect

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

    def append_to_system(self, text: str) -> bool:
        """Add ``text`` after the system prompt; False when the request has none to extend.
        The added text comes after every existing byte of the prompt."""
        return self.wire.append_to_system(self, text)

    def append_to_message(self, index: int, text: str) -> bool:
        """Add ``text`` at the end of wire message ``index`` (a user message)."""
        return self.wire.append_to_message(self, index, text)

    def drop_reasoning(self, items: list[Item]) -> int:
        """Remove these reasoning items whole, where the format allows it, from the body and
        from this view (later stages append by message index); how many went."""
        return self.wire.drop_reasoning(self, items)


def _copy_containers(value: Any, copies: dict[int, Any]) -> Any:
    """A copy of every dict and list in ``value`` (the strings and numbers are shared), and in
    ``copies`` which copy each original container became, by the original's id."""
    copy: Any
    if isinstance(value, dict):
        copy = {
            key: _copy_containers(inner, copies) if isinstance(inner, dict | list) else inner
            for key, inner in value.items()
        }
    else:
        copy = [
            _copy_containers(inner, copies) if isinstance(inner, dict | list) else inner
            for inner in value
        ]
    copies[id(value)] = copy
    return copy
