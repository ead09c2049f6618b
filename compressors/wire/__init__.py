"""The wire formats deepmem reads, one module each, and the one list of them.

``FORMATS`` says which formats exist and in what order routes and usage are tried. A new
format is a module implementing ``WireFormat`` (``compressors/wire/base.py``) and one line
here; nothing outside this package branches on the dialect.
"""

from __future__ import annotations

from collections.abc import Mapping

from compressors.view import Conversation, Dialect, UnrecognisedBody, Walked
from compressors.wire import anthropic, openai_chat, openai_responses
from compressors.wire.base import (
    Usage,
    WireFormat,
    cache_mark_spans,
    without_cache_mark_bytes,
    without_cache_marks,
)

__all__ = [
    "FORMATS",
    "Usage",
    "WireFormat",
    "cache_mark_spans",
    "chat_dialect",
    "error_body",
    "error_style",
    "parse_conversation",
    "read_usage",
    "sse_error_event",
    "usage_markers",
    "without_cache_mark_bytes",
    "without_cache_marks",
]

FORMATS: dict[Dialect, WireFormat] = {
    wire.dialect: wire for wire in (openai_chat.FORMAT, anthropic.FORMAT, openai_responses.FORMAT)
}
DEFAULT_ERROR_STYLE = Dialect.OPENAI_CHAT  # for calls no format claims


def parse_conversation(
    dialect: Dialect, body: object, known: Walked | None = None, *, keep: bool = False
) -> Conversation:
    """Build the view of a parsed request body; raise ``UnrecognisedBody`` if it is not a chat
    body of ``dialect`` or has a field of a shape the view does not understand. ``known``: what
    the walk of the session's previous body found (its ``walked``), when this body may begin
    with the same message objects (``proxy.bodies``); those are not read again. ``keep``: the
    view's ``walked`` says what this walk found, for the session's next body."""
    if not isinstance(body, dict):
        raise UnrecognisedBody("request body is not a JSON object")
    if not isinstance(body.get("tools", []), list | None):
        raise UnrecognisedBody("'tools' is not a list")
    wire = FORMATS[dialect]
    conversation = Conversation(wire, body, keep_walk=keep)
    wire.walk(conversation, known)
    return conversation


def chat_dialect(method: str, subpath: str) -> Dialect | None:
    """The dialect whose request-rewrite hook handles this call, or None to relay untouched."""
    if method != "POST":
        return None
    path = subpath.rstrip("/")
    for dialect, wire in FORMATS.items():
        if path.endswith(wire.path_suffix):
            return dialect
    return None


def error_style(subpath: str, headers: Mapping[str, str]) -> Dialect:
    """Which provider's error shape a client on this path understands."""
    dialect = chat_dialect("POST", subpath)
    if dialect is not None:
        return dialect
    for dialect, wire in FORMATS.items():
        if wire.owns_path(subpath, headers):
            return dialect
    return DEFAULT_ERROR_STYLE


def error_body(style: Dialect, message: str, error_type: str, code: str) -> bytes:
    """An error in the provider's own shape, so the client shows it like any provider error."""
    return FORMATS[style].error_body(message, error_type, code)


def sse_error_event(style: Dialect, message: str) -> bytes:
    """A terminal SSE event telling the client its stream broke off upstream."""
    return FORMATS[style].sse_error_event(message)


def read_usage(usage: Usage, event: object) -> bool:
    """Fold one parsed SSE event or JSON answer, of whichever format, into ``usage``; True
    when it carried usage. The formats' answers differ in shape, so at most one reads it."""
    if not isinstance(event, dict):
        return False
    return any(wire.read_usage(usage, event) for wire in FORMATS.values())


def usage_markers() -> tuple[bytes, ...]:
    """Bytes one of which every SSE data line that carries usage contains, in any format."""
    return tuple(dict.fromkeys(wire.usage_marker for wire in FORMATS.values()))
