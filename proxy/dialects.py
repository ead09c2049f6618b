"""What differs between the wire formats at the HTTP level: routes, error shapes, usage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from compressors.view import Dialect

CHAT_SUFFIXES: tuple[tuple[str, Dialect], ...] = (
    ("/chat/completions", Dialect.OPENAI_CHAT),
    ("/messages", Dialect.ANTHROPIC),
    ("/responses", Dialect.OPENAI_RESPONSES),
)


def chat_dialect(method: str, subpath: str) -> Dialect | None:
    """The dialect whose request-rewrite hook handles this call, or None to relay untouched."""
    if method != "POST":
        return None
    path = subpath.rstrip("/")
    for suffix, dialect in CHAT_SUFFIXES:
        if path.endswith(suffix):
            return dialect
    return None


def error_style(subpath: str, headers: Any) -> Dialect:
    """Which provider's error shape a client on this path understands."""
    dialect = chat_dialect("POST", subpath)
    if dialect is not None:
        return dialect
    if "/messages" in subpath or "anthropic-version" in headers:
        return Dialect.ANTHROPIC
    return Dialect.OPENAI_CHAT


def error_body(style: Dialect, message: str, error_type: str, code: str) -> bytes:
    """An error in the provider's own shape, so the client shows it like any provider error."""
    if style is Dialect.ANTHROPIC:
        return orjson.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return orjson.dumps({"error": {"message": message, "type": error_type, "code": code}})


def sse_error_event(style: Dialect, message: str) -> bytes:
    """A terminal SSE event telling the client its stream broke off upstream."""
    if style is Dialect.ANTHROPIC:
        payload = error_body(style, message, "api_error", "upstream_stream_interrupted")
        return b"event: error\ndata: " + payload + b"\n\n"
    if style is Dialect.OPENAI_RESPONSES:
        payload = orjson.dumps(
            {"type": "error", "code": "upstream_stream_interrupted", "message": message}
        )
        return b"event: error\ndata: " + payload + b"\n\n"
    return (
        b"data: "
        + error_body(style, message, "upstream_error", "upstream_stream_interrupted")
        + (b"\n\n")
    )


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


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def merge_usage(usage: Usage, event: object) -> bool:
    """Fold one parsed SSE event or JSON response into ``usage``; True when it carried usage."""
    if not isinstance(event, dict):
        return False
    kind = event.get("type")
    if kind == "message_start" and isinstance(event.get("message"), dict):
        return _merge_anthropic(usage, event["message"].get("usage"))
    if kind == "message_delta":
        return _merge_anthropic(usage, event.get("usage"))
    if kind == "message":  # Anthropic non-streaming response
        return _merge_anthropic(usage, event.get("usage"))
    if kind in ("response.completed", "response.incomplete", "response.failed") and isinstance(
        event.get("response"), dict
    ):
        return _merge_responses(usage, event["response"].get("usage"))
    if event.get("object") == "response":  # Responses non-streaming response
        return _merge_responses(usage, event.get("usage"))
    raw = event.get("usage")
    if isinstance(raw, dict) and "prompt_tokens" in raw:  # chat completions
        usage.input_tokens = _int(raw.get("prompt_tokens"))
        usage.output_tokens = _int(raw.get("completion_tokens"))
        details = raw.get("prompt_tokens_details")
        if isinstance(details, dict):
            usage.cache_read_tokens = _int(details.get("cached_tokens"))
        return True
    return False


def _merge_anthropic(usage: Usage, raw: object) -> bool:
    if not isinstance(raw, dict):
        return False
    if "input_tokens" in raw or "cache_read_input_tokens" in raw:
        usage.cache_read_tokens = _int(raw.get("cache_read_input_tokens"))
        usage.cache_write_tokens = _int(raw.get("cache_creation_input_tokens"))
        usage.input_tokens = (
            _int(raw.get("input_tokens")) + usage.cache_read_tokens + usage.cache_write_tokens
        )
    if "output_tokens" in raw:
        usage.output_tokens = _int(raw.get("output_tokens"))
    return True


def _merge_responses(usage: Usage, raw: object) -> bool:
    if not isinstance(raw, dict):
        return False
    usage.input_tokens = _int(raw.get("input_tokens"))
    usage.output_tokens = _int(raw.get("output_tokens"))
    details = raw.get("input_tokens_details")
    if isinstance(details, dict):
        usage.cache_read_tokens = _int(details.get("cached_tokens"))
    return True


class UsageReader:
    """Reads ``usage`` from response bytes as they pass, without holding them back.

    SSE bodies are split into lines; only ``data:`` lines that mention usage are parsed. A JSON
    body is kept (up to a cap) and parsed once at the end. Compressed bodies are inflated on the
    side for gzip and deflate; other encodings are not read.
    """

    JSON_CAP = 8 * 1024 * 1024

    def __init__(self, content_type: str, content_encoding: str) -> None:
        self.usage = Usage()
        self.seen = False
        self._sse = "text/event-stream" in content_type
        self._json = not self._sse and "json" in content_type
        self._pending = b""
        self._json_parts: list[bytes] = []
        self._json_size = 0
        self._inflate: Any = None
        self._active = self._sse or self._json
        encoding = content_encoding.strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            import zlib

            wbits = 16 + zlib.MAX_WBITS if "gzip" in encoding else zlib.MAX_WBITS
            self._inflate = zlib.decompressobj(wbits)
        elif encoding not in ("", "identity"):
            self._active = False

    def feed(self, chunk: bytes) -> None:
        if not self._active:
            return
        try:
            if self._inflate is not None:
                chunk = self._inflate.decompress(chunk)
            if self._sse:
                self._feed_sse(chunk)
            else:
                self._json_size += len(chunk)
                if self._json_size > self.JSON_CAP:
                    self._active = False
                    self._json_parts.clear()
                else:
                    self._json_parts.append(chunk)
        except Exception:  # a body we cannot read is still relayed; we just learn no usage
            self._active = False

    def _feed_sse(self, chunk: bytes) -> None:
        data = self._pending + chunk if self._pending else chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > self.JSON_CAP:
            self._pending = b""
        for line in lines:
            if line.startswith(b"data:") and b'usage"' in line:
                self._read_event(line[5:].strip())

    def _read_event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if merge_usage(self.usage, event):
            self.seen = True

    def finish(self) -> Usage | None:
        if self._active:
            if self._sse and self._pending.startswith(b"data:"):
                self._read_event(self._pending[5:].strip())
            elif self._json and self._json_parts:
                self._read_event(b"".join(self._json_parts))
        self._json_parts.clear()
        return self.usage if self.seen else None
