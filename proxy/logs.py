"""Logging setup and credential redaction. Logs never carry keys; bodies only when asked.

Both formatters pass every line through ``redact_text``, so a credential that reaches a log
message by any route (an exception text, a URL) is still replaced.

The server's lines are formatted and written by a thread of their own (``LogWriter``): a
request only queues its record. A slow or blocked standard error (a terminal scrolled back, a
pipe nobody reads, a busy log driver) then never holds the event loop, and with it every
stream; when the queue is full, lines are dropped and counted instead.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

from memory.threads import NamedThread

# Headers that carry credentials without saying so in their name.
SECRET_HEADERS = frozenset({"openai-organization", "openai-project"})
# Any header whose name mentions a key, token, secret, password, signature, cookie or auth
# (x-goog-api-key, x-portkey-api-key, cf-aig-authorization, x-amz-security-token, ...).
_SECRET_HEADER_NAME = re.compile(
    r"key|token|secret|passw|signature|cookie|credential|auth", re.IGNORECASE
)
REDACTED = "<redacted>"
# Names of JSON fields and URL query parameters whose value is a credential.
_SECRET_NAME = (
    r"(?:[\w-]*(?:api[_-]?key|apikey|secret|passw(?:or)?d|access[_-]?token|refresh[_-]?token"
    r"|auth[_-]?token|id[_-]?token|authorization|signature)[\w-]*|key|token|sig|auth|password)"
)
# Each pattern with what replaces it; every log line goes through them, so they stay cheap
# (a lookahead on the first letter of a token shape, ``://`` for userinfo).
_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (  # well-known token shapes
        re.compile(
            r"\b(?=[sprageAhxBb])(?:(?:sk|pk|rk|sess|ak)-[A-Za-z0-9_\-]{8,}"
            r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|glpat-[A-Za-z0-9_\-]{16,}"
            r"|hf_[A-Za-z0-9]{20,}|AIza[0-9A-Za-z_\-]{30,}|xox[abposr]-[A-Za-z0-9\-]{8,}"
            r"|(?:AKIA|ASIA)[0-9A-Z]{16}\b"
            r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"
            r"|(?i:Bearer|Basic)\s+[A-Za-z0-9._\-~+/=]{8,})"
        ),
        REDACTED,
    ),
    (re.compile(r"://[^/?#@\s\"'<>]+@"), f"://{REDACTED}@"),  # the user:password@ of a URL
)
# And these two, only where a credential's name can be: every name ``_SECRET_NAME`` matches
# contains one of ``_SECRET_NAME_WORDS``, so an ASCII line without them has nothing for them
# (the JSON-field pattern is the slowest of all, on a JSON log line most of the time).
_NAMED_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (  # the value of a key-like query parameter
        re.compile(rf"([?&]{_SECRET_NAME}=)[^&#\s\"'<>]*", re.IGNORECASE),
        rf"\1{REDACTED}",
    ),
    (  # the value of a JSON field that names a credential
        re.compile(rf"(\"{_SECRET_NAME}\"\s*:\s*)\"[^\"]*\"", re.IGNORECASE),
        rf'\1"{REDACTED}"',
    ),
)
_SECRET_NAME_WORDS = ("key", "secret", "passw", "token", "auth", "sig")
BODY_LOG_LIMIT = 4096


def is_secret_header(name: str) -> bool:
    return name.lower() in SECRET_HEADERS or _SECRET_HEADER_NAME.search(name) is not None


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {name: REDACTED if is_secret_header(name) else value for name, value in headers}


def redact_text(text: str) -> str:
    """``text`` without credentials: token shapes, URL userinfo, key-like query parameters
    and JSON fields that name a credential. Every log line and every URL deepmem shows
    passes through it."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    if text.isascii():  # (case-insensitive matching of other scripts is not ``lower``'s)
        lowered = text.lower()
        if not any(word in lowered for word in _SECRET_NAME_WORDS):
            return text
    for pattern, replacement in _NAMED_REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


def body_for_log(raw: bytes) -> str:
    text = raw[:BODY_LOG_LIMIT].decode("utf-8", "replace")
    suffix = f"… ({len(raw)} bytes)" if len(raw) > BODY_LOG_LIMIT else ""
    return redact_text(text) + suffix


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted where it was raised (``LogWriter``)
            entry["exception"] = record.exc_text
        return redact_text(json.dumps(entry, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{key}={value}" for key, value in fields.items())
        return redact_text(line)


@dataclass(frozen=True, slots=True)
class LogLine:
    """A line made where something happened and written later, on another thread (a
    request's access line is made on the event loop and written by the bookkeeping thread):
    the line carries the time it was made."""

    message: str
    fields: dict[str, Any]
    at: float  # ``time.time()`` when it was made

    def write(self, logger: logging.Logger, level: int = logging.INFO) -> None:
        if not logger.isEnabledFor(level):
            return
        record = logger.makeRecord(
            logger.name, level, "", 0, self.message, (), None, extra={"fields": self.fields}
        )
        late = record.created - self.at
        record.created = self.at
        record.msecs = int((self.at - int(self.at)) * 1000) + 0.0
        record.relativeCreated -= late * 1000
        logger.handle(record)


LOG_QUEUE_RECORDS = 10_000  # lines waiting for the writer; more are dropped and counted
LOG_STOP_SECONDS = 5.0  # how long stopping waits for the waiting lines to be written
# How long the writer lets lines gather once one waits: it then writes them all. A request's
# line does not wake a thread (and take the event loop's turn) of its own.
LOG_BATCH_SECONDS = 0.05


class LogWriter(logging.Handler):
    """Queues each record for a writer thread, which formats it and hands it to ``target``.

    The record's message is made text here, where it was logged (its arguments may change
    later), and so is an exception's traceback; everything else (the formatter, redaction, the
    write) happens on the writer thread, in batches: the first line to wait wakes it, and it
    writes what came within ``batch_seconds`` of that one together. When ``capacity`` records
    are waiting, the next ones are dropped, and the writer says how many before its next line.

    The standard library's ``QueueHandler`` formats the whole line where it was logged, reports
    a full queue as an error, and its ``QueueListener`` waits without limit for a writer stuck
    on a blocked output when it stops: none of which may happen on the event loop or at exit."""

    def __init__(
        self,
        target: logging.Handler,
        capacity: int = LOG_QUEUE_RECORDS,
        batch_seconds: float = LOG_BATCH_SECONDS,
    ) -> None:
        super().__init__()
        self.target = target
        self.capacity = capacity
        self.batch_seconds = batch_seconds
        self._waiting: deque[logging.LogRecord] = deque()
        self._dropped = 0
        self._dropped_lock = threading.Lock()
        self._ready = threading.Event()  # a line waits (set by the first of a batch)
        self._stopping = threading.Event()
        self._thread = NamedThread(target=self._write, name="deepmem-log", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Lines logged and not yet handed to the target."""
        return len(self._waiting)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if len(self._waiting) >= self.capacity:
                with self._dropped_lock:
                    self._dropped += 1
                return
            self._waiting.append(self._prepared(record))
            if not self._ready.is_set():  # appended first: the writer's clear comes before
                self._ready.set()  # its drain, so no line is left without a wake-up
        except Exception:
            self.handleError(record)

    def _prepared(self, record: logging.LogRecord) -> logging.LogRecord:
        """The record as the writer takes it: its message text, and an exception's traceback
        as text (on a copy then, so the handlers after this one still see the exception)."""
        if not record.exc_info:
            record.msg, record.args = record.getMessage(), None
            return record
        prepared = copy.copy(record)
        prepared.msg, prepared.args = record.getMessage(), None
        formatter = self.target.formatter or logging.Formatter()
        prepared.exc_text = record.exc_text or formatter.formatException(record.exc_info)
        prepared.exc_info = None  # the traceback's frames are not kept alive in the queue
        return prepared

    def _write(self) -> None:
        while True:
            self._ready.wait()
            self._stopping.wait(self.batch_seconds)  # the lines that come meanwhile, too
            self._ready.clear()
            self._drain()
            if self._stopping.is_set() and not self._waiting:
                return

    def _drain(self) -> None:
        waiting = self._waiting
        while True:
            with self._dropped_lock:
                dropped, self._dropped = self._dropped, 0
            if dropped:
                self.target.handle(_dropped_record(dropped))
            if not waiting:
                return
            self.target.handle(waiting.popleft())

    def close(self) -> None:
        """Write what waits (for at most ``LOG_STOP_SECONDS``), then stop the thread."""
        if self._thread.is_alive():
            self._stopping.set()
            self._ready.set()
            self._thread.join(LOG_STOP_SECONDS)
        if not self._thread.is_alive():  # a stuck writer holds the output: do not wait on it
            self.target.flush()
        super().close()


def _dropped_record(count: int) -> logging.LogRecord:
    message = f"{count} log line{'s' if count != 1 else ''} dropped: the log output fell behind"
    return logging.LogRecord("deepmem", logging.WARNING, __file__, 0, message, None, None)


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> LogWriter:
    """Log to ``stream`` (standard error) through a ``LogWriter``; the caller closes it."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    writer = LogWriter(handler)
    root = logging.getLogger()
    for previous in root.handlers:
        if isinstance(previous, LogWriter):
            previous.close()
    root.handlers[:] = [writer]
    root.setLevel(level.upper())
    # aiohttp's access log would duplicate ours; its errors still come through.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return writer
