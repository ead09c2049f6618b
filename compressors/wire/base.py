"""What every wire format provides, and the helpers the three formats share.

A wire format owns everything that differs between the providers' request and response
shapes: walking a body into the view, appending to the system prompt and to a message,
dropping reasoning, naming the tools a request offers, the history a checkpoint keeps, error
bodies and stream error events, and the usage an answer reports. Code outside
``compressors/wire/`` asks the format; it never branches on the dialect.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from operator import is_not
from typing import Any, Protocol

from compressors.view import Conversation, Dialect, Item, Kind, Role, UnrecognisedBody, Walked

JsonObject = dict[str, Any]


@dataclass(slots=True)
class Usage:
    """Token usage the provider reported, normalised across formats.

    ``input_tokens`` counts the whole prompt, cached parts included.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


class WireFormat(Protocol):
    """One provider's wire format. Each method takes or changes the parsed body in place."""

    dialect: Dialect
    path_suffix: str  # a POST to a path ending in this is a chat request of this format
    usage_marker: bytes  # every SSE data line that carries usage contains these bytes

    def walk(self, conversation: Conversation, known: Walked | None = None) -> None:
        """Append the body's items to ``conversation.items`` in wire order; raise
        ``UnrecognisedBody`` for a body (or a field) of a shape the format does not know.
        The wire messages are walked between ``conversation.begin_walk`` (given ``known``:
        what the walk of the session's previous body found, to go on after the messages this
        body repeats) and ``conversation.end_walk``."""

    messages_key: str  # the body's list of wire messages (or input items)
    # The body's other members the view may change (the system prompt, where it is one); the
    # rest are only ever read (``proxy.bodies`` takes them again from an earlier request).
    edited_members: frozenset[str]
    # Compact JSON bytes that only a user message of this format holds (a string's quotes are
    # escaped, so inside one they cannot occur); None when a tool result is a user message too.
    user_message_bytes: bytes | None

    def messages(self, body: JsonObject) -> list[Any]:
        """The body's list of wire messages; empty when it has none (a bare string input)."""

    def append_to_system(self, conversation: Conversation, text: str) -> bool:
        """Add ``text`` after the system prompt; False when there is none to extend."""

    def append_to_message(self, conversation: Conversation, index: int, text: str) -> bool:
        """Add ``text`` at the end of wire message ``index``; False when it cannot be done."""

    def drop_reasoning(self, conversation: Conversation, items: list[Item]) -> int:
        """Remove these reasoning items whole from the body and the view (where the provider
        allows it); how many were removed."""

    def tool_names(self, body: JsonObject) -> list[str]:
        """The names of the tools the request offers."""

    def history_messages(self, body: JsonObject) -> list[Any]:
        """The request's messages, a top-level system prompt first, for a checkpoint."""

    def message_count(self, body: JsonObject) -> int:
        """How many wire messages (or input items) the request carries."""

    def owns_path(self, subpath: str, headers: Mapping[str, str]) -> bool:
        """Whether a call that is not a chat request (``/models``, ``count_tokens``) is made
        to this provider's API, so an error for it takes this format's shape."""

    def error_body(self, message: str, error_type: str, code: str) -> bytes:
        """An error in the provider's own shape, so the client shows it like any other."""

    def sse_error_event(self, message: str) -> bytes:
        """A terminal SSE event telling the client its stream broke off upstream."""

    def read_usage(self, usage: Usage, event: JsonObject) -> bool:
        """Fold one parsed SSE event or JSON answer into ``usage``; True when it had usage."""


# --- helpers the formats share ----------------------------------------------------------------


def text_parts(
    out: list[Item], role: Role, kind: Kind, message: int, holder: Any, key: str | int
) -> None:
    """Items for a ``content`` that is a string or a list of typed text parts."""
    if key not in holder:
        raise UnrecognisedBody(f"{where(message)} has no {key!r}")
    value = holder[key]
    if isinstance(value, str):
        out.append(Item(kind, role, message, holder, key))
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(Item(kind, role, message, part, "text"))
    elif value is not None:
        raise UnrecognisedBody(f"{key!r} of {where(message)} is neither text nor a list of parts")


def without_cache_marks(value: Any) -> Any:
    """``value`` with its cache marks left out, at any depth: what a message says, apart from
    the prompt-cache breakpoints a client moves from request to request. A mark is a
    ``cache_control`` member whose value is an object of strings, numbers and literals (as every
    client sends them; ``cache_mark_spans`` finds the same ones in compact JSON). A container
    with no mark inside is the very object given, not a copy; ``value`` is not changed."""
    if isinstance(value, dict):
        kept: dict[str, Any] = {}
        changed = False
        for key, member in value.items():
            if isinstance(member, dict | list):  # a string or number has no mark inside
                if key == "cache_control" and _is_flat_object(member):
                    changed = True
                    continue
                without = without_cache_marks(member)
                changed = changed or without is not member
                member = without
            kept[key] = member
        return kept if changed else value
    if isinstance(value, list):
        items = [
            without_cache_marks(item) if isinstance(item, dict | list) else item for item in value
        ]
        return items if any(map(is_not, items, value)) else value
    return value


def _is_flat_object(value: Any) -> bool:
    return isinstance(value, dict) and not any(isinstance(v, dict | list) for v in value.values())


_MARK_KEY = b'"cache_control":'
# A mark's value: an object of plain members (no object or list inside).
_FLAT_OBJECT = re.compile(rb'\{(?:[^{}"\[\]]|"(?:[^"\\]|\\.)*")*\}')


def cache_mark_spans(data: bytes) -> list[tuple[int, int]]:
    """Where ``without_cache_marks`` would leave something out of the value that compact JSON
    ``data`` (as orjson writes it) holds: each mark with the comma that joins it to the member
    before it, or else to the one after it; the rest of ``data`` is that value without them,
    as compact JSON. Only marks whose value is an object of strings, numbers and literals (as
    every client sends them) are found; a mark of another value is left in.

    A mark is its key where a key begins (after ``{`` or ``,``: inside a string a quote is
    escaped), then its value."""
    spans: list[tuple[int, int]] = []
    at = data.find(_MARK_KEY)
    while at >= 0:
        before = data[at - 1 : at]
        value = _FLAT_OBJECT.match(data, at + len(_MARK_KEY)) if before in (b"{", b",") else None
        if value is None:
            at = data.find(_MARK_KEY, at + 1)
            continue
        start, end = at, value.end()
        if before == b",":
            start -= 1
        elif data[end : end + 1] == b",":
            end += 1
        spans.append((start, end))
        at = data.find(_MARK_KEY, end)
    return spans


def without_cache_mark_bytes(data: bytes) -> bytes:
    """``data`` without its ``cache_mark_spans``: ``without_cache_marks`` of its value, as
    compact JSON. Comparing two messages this way took 13 µs a request in process, against 57
    for rebuilding both objects without their marks (the Anthropic format's two re-sent
    messages, their previous objects no longer in the processor's cache)."""
    spans = cache_mark_spans(data)
    if not spans:
        return data
    ends = [0] + [end for _, end in spans]
    starts = [start for start, _ in spans] + [len(data)]
    return b"".join(data[end:start] for end, start in zip(ends, starts, strict=True))


def message_object(index: int, message: object) -> JsonObject:
    if not isinstance(message, dict):
        raise UnrecognisedBody(f"message {index} is not an object")
    return message


def where(message: int) -> str:
    return "the system prompt" if message < 0 else f"message {message}"


def appended(value: Any, text: str, part_type: str) -> Any:
    """A content with ``text`` added: a string's after a blank line, a list of parts' as a
    typed text part of its own; None when ``value`` is neither. ``value`` is not changed."""
    if isinstance(value, str):
        return value + "\n\n" + text if value else text
    if isinstance(value, list):
        return [*value, {"type": part_type, "text": text}]
    return None


def append_content(holder: JsonObject, key: str, text: str, part_type: str) -> bool:
    """Append to the content at ``holder[key]`` (a member of the body's own, not a message)."""
    value = appended(holder.get(key), text, part_type)
    if value is None:
        return False
    holder[key] = value
    return True


def append_to_entry(conversation: Conversation, index: int, text: str, part_type: str) -> bool:
    """Append to the content of wire message ``index``: a changed copy of the message, the
    same copy on every request of the session that makes the same addition to it (which its
    body's writer does not serialise again)."""
    entries = conversation.wire.messages(conversation.body)
    if not 0 <= index < len(entries) or not isinstance(entries[index], dict):
        return False
    if not isinstance(entries[index].get("content"), str | list):
        return False
    change = ("append", text, part_type)
    conversation.replace_message(index, change, partial(_with_appended, text, part_type))
    return True


def _with_appended(text: str, part_type: str, message: JsonObject) -> JsonObject:
    return {**message, "content": appended(message["content"], text, part_type)}


def listed(body: JsonObject, key: str) -> list[Any]:
    """``body[key]`` when it is a list, else an empty one."""
    value = body.get(key)
    return value if isinstance(value, list) else []


def list_length(messages: object) -> int:
    """How many messages a ``messages`` or ``input`` field holds (a bare string is one)."""
    if isinstance(messages, list):
        return len(messages)
    return 1 if isinstance(messages, str) else 0


def count(value: object) -> int:
    """A token count from a usage field: an int, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
