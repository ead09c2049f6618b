"""Every rewrite visible: per forwarded chat request, a compact record of what the addons
changed, for the dashboard's request view ("instead of sending X we sent Y").

A record is built on the rewrite thread from what the addons already reported
(``proxy.flow.Flow.changes``): for each changed item its message index, kind, tool, sizes
before and after, the CCR key its original is kept under (the view fetches the original through
``GET /expand/{key}``), the text forwarded in its place or added to it (capped at
``MAX_TEXT_CHARS``). No body is kept or serialised for it.

Records live in this process's memory only, bounded: the last ``per_session`` requests of the
``max_sessions`` sessions that made one most recently, at most ``max_bytes`` over all, and never
longer than the originals' retention. With replicas (``state_url``) a record stays on the
replica that served the request; the view says so when it is not on the one asked.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from compressors.changes import Change
from proxy.admin import error_response, json_response
from proxy.dashboard import Handler
from proxy.logs import redact_text

MAX_TEXT_CHARS = 4096  # of each change's forwarded or injected text
MAX_CHANGES = 500  # per request; past it only the count is kept
PER_SESSION = 50
MAX_SESSIONS = 200
MAX_BYTES = 16 * 1024 * 1024
CHANGE_OVERHEAD = 200  # bytes a change costs besides its text, about (object, dict, numbers)
RECORD_OVERHEAD = 600


def shown_change(change: Change, text_chars: int) -> dict[str, Any]:
    """A kept change as JSON (``text_chars``: the length of its text before it was capped)."""
    shown: dict[str, Any] = {
        "kind": str(change.kind),
        "message": change.message,
        "tool": change.tool,
        "chars_before": change.chars_before,
        "chars_after": change.chars_after,
        "tokens_before": change.tokens_before,
        "tokens_after": change.tokens_after,
        "new": change.new,
        "key": change.key,
        "text": change.text,
        "text_chars": text_chars,
        "text_truncated": text_chars > len(change.text),
    }
    if change.keys:
        shown["keys"] = list(change.keys)
    if change.blocks:
        shown["blocks"] = list(change.blocks)
    return shown


def _kept(change: Change) -> tuple[Change, int]:
    """The change as a record keeps it: its text capped at ``MAX_TEXT_CHARS`` (most are
    shorter, and kept as the very objects the addons made), and the text's length."""
    return change.capped(MAX_TEXT_CHARS), len(change.text)


@dataclass(slots=True)
class RewriteRecord:
    """What one chat request arrived as and was forwarded as, item by item."""

    id: str
    session_id: str
    at: float
    kind: str
    outcome: str
    replica: str
    dialect: str | None = None
    model: str | None = None
    project: str | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    reason: str | None = None  # why it went untouched (relayed), or what failed (failed open)
    changes: list[tuple[Change, int]] = field(default_factory=list)  # ``_kept``
    changes_left_out: int = 0  # past MAX_CHANGES
    size: int = 0  # bytes it holds, about

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "session_id": self.session_id,
            "at": self.at,
            "kind": self.kind,
            "outcome": self.outcome,
            "replica": self.replica,
            "dialect": self.dialect,
            "model": self.model,
            "project": self.project,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "reason": self.reason,
            "changes": [shown_change(change, length) for change, length in self.changes],
            "changes_left_out": self.changes_left_out,
        }


def build_record(
    record_id: str,
    session_id: str,
    kind: str,
    outcome: str,
    replica: str,
    changes: list[Change],
    *,
    dialect: str | None = None,
    model: str | None = None,
    project: str | None = None,
    bytes_in: int = 0,
    bytes_out: int = 0,
    reason: str | None = None,
    at: float | None = None,
) -> RewriteRecord:
    kept = [_kept(change) for change in changes[:MAX_CHANGES]]
    size = RECORD_OVERHEAD + sum(CHANGE_OVERHEAD + len(change.text) for change, _ in kept)
    return RewriteRecord(
        record_id,
        session_id,
        time.time() if at is None else at,
        kind,
        outcome,
        replica,
        dialect,
        model,
        project,
        bytes_in,
        bytes_out,
        redact_text(reason) if reason else None,
        kept,
        max(0, len(changes) - MAX_CHANGES),
        size,
    )


class RewriteLog:
    """The records of this process, bounded (module docstring). Appended to from the rewrite
    threads, read on the event loop: one lock."""

    def __init__(
        self,
        retention_seconds: float,
        per_session: int = PER_SESSION,
        max_sessions: int = MAX_SESSIONS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.retention_seconds = retention_seconds
        self.per_session = per_session
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.bytes = 0
        self._sessions: OrderedDict[str, deque[RewriteRecord]] = OrderedDict()
        self._lock = threading.Lock()
        self._prefix = secrets.token_hex(3)  # ids of another process (a replica) differ
        self._numbers = itertools.count(1)

    def new_id(self) -> str:
        return f"{self._prefix}-{next(self._numbers)}"

    def add(self, record: RewriteRecord) -> None:
        with self._lock:
            records = self._sessions.get(record.session_id)
            if records is None:
                records = self._sessions[record.session_id] = deque()
            else:
                self._sessions.move_to_end(record.session_id)
            records.append(record)
            self.bytes += record.size
            while len(records) > self.per_session:
                self.bytes -= records.popleft().size
            self._evict(record.at, every_session=False)

    def _evict(self, now: float, *, every_session: bool = True) -> None:
        """Expired records, then the least recently recorded sessions past ``max_sessions``,
        then the oldest records past ``max_bytes`` (the newest record always stays). A record
        added looks for expired ones only in the sessions recorded before any that still
        holds a live one (a log at its byte cap, the steady state, drops from those anyway): a
        reader looks in every session first, so none it is given has expired."""
        oldest_kept = now - self.retention_seconds
        if every_session:
            for session_id in list(self._sessions):
                records = self._sessions[session_id]
                while records and records[0].at < oldest_kept:
                    self.bytes -= records.popleft().size
                if not records:
                    del self._sessions[session_id]
        else:
            while self._sessions:
                records = next(iter(self._sessions.values()))
                if records[-1].at >= oldest_kept:
                    break
                self.bytes -= sum(record.size for record in records)
                self._sessions.popitem(last=False)
        while len(self._sessions) > self.max_sessions:
            _, records = self._sessions.popitem(last=False)
            self.bytes -= sum(r.size for r in records)
        while self.bytes > self.max_bytes and self._sessions:
            session_id, records = next(iter(self._sessions.items()))
            if len(self._sessions) == 1 and len(records) == 1:
                break
            self.bytes -= records.popleft().size
            if not records:
                del self._sessions[session_id]

    def get(self, session_id: str, record_id: str) -> RewriteRecord | None:
        with self._lock:
            self._evict(time.time())
            for record in self._sessions.get(session_id, ()):
                if record.id == record_id:
                    return record
        return None

    def __len__(self) -> int:
        with self._lock:
            return sum(len(records) for records in self._sessions.values())


def rewrite_handler(
    rewrites: RewriteLog, replica: str, flush: Callable[[], None] = lambda: None
) -> Handler:
    """``GET /sessions/{sid}/requests/{rid}``: one request's record (an admin endpoint),
    after ``flush`` (the records of requests answered and not yet counted)."""

    async def handler(request: web.Request) -> web.Response:
        session_id, record_id = request.match_info["sid"], request.match_info["rid"]
        await asyncio.to_thread(flush)  # counting what is settled: not on the event loop
        record = rewrites.get(session_id, record_id)
        if record is None:
            days = rewrites.retention_seconds / 86400
            return error_response(
                404,
                f"no record of request {record_id!r} of session {session_id!r} on replica "
                f"{replica!r}: each replica keeps, in memory, what it changed in the last "
                f"{rewrites.per_session} requests of each of the {rewrites.max_sessions} "
                f"sessions it served most recently (at most {days:g} days, lost on restart); "
                "a request served by another replica is on that replica",
                "not_found",
                "unknown_request",
            )
        return json_response({"replica": replica, "request": record.as_dict()})

    return handler
