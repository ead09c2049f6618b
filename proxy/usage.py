"""Usage read from an answer's bytes as they pass, in whichever wire format it comes.

The formats themselves (routes, error shapes, what their usage looks like) are in
``compressors/wire/``; this module only splits and inflates the stream.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from compressors.wire import Usage, read_usage, usage_markers

# One search per SSE data line, whatever the number of formats (one marker today).
_MENTIONS_USAGE = re.compile(b"|".join(re.escape(marker) for marker in usage_markers()))


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
            if line.startswith(b"data:") and _MENTIONS_USAGE.search(line) is not None:
                self._read_event(line[5:].strip())

    def _read_event(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if read_usage(self.usage, event):
            self.seen = True

    def finish(self) -> Usage | None:
        if self._active:
            if self._sse and self._pending.startswith(b"data:"):
                self._read_event(self._pending[5:].strip())
            elif self._json and self._json_parts:
                self._read_event(b"".join(self._json_parts))
        self._json_parts.clear()
        return self.usage if self.seen else None
