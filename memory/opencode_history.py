"""Read OpenCode's own local database (``opencode.db``) strictly read-only.

OpenCode (1.18.x) keeps one row per session in ``session``, one per message in ``message``
and one per message part in ``part``; ``message.data`` and ``part.data`` are JSON. A message
is ``{"role": "user"|"assistant", "time": {"created": ms}, ...}`` (an assistant message also
has ``agent``, ``modelID``, ``providerID``, ``finish``, and ``"summary": true`` when it is a
compaction summary). A part is ``{"type": ...}``: ``text`` (``text``, ``synthetic``),
``reasoning`` (``text``), ``tool`` (``tool``, ``callID``, ``state``: ``{status, input,
output | error}``), ``step-start``, ``step-finish``, ``compaction`` (``auto``), ``patch``
(``files``), ``file``, ``agent``, ``subtask``, ``retry``, ``snapshot``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DB_FILE = "opencode.db"
SQLITE_MAGIC = b"SQLite format 3\x00"
REQUIRED_COLUMNS: Mapping[str, frozenset[str]] = {
    "session": frozenset({"id", "parent_id", "directory", "title", "time_created", "time_updated"}),
    "message": frozenset({"id", "session_id", "time_created", "data"}),
    "part": frozenset({"id", "message_id", "session_id", "time_created", "data"}),
}

TOOL_INPUT_CHARS = 160
TOOL_OUTPUT_CHARS = 240
REASONING_CHARS = 300
SNIPPET_CONTEXT = 60
# Bookkeeping parts that say nothing about what a session did.
SILENT_PARTS = frozenset({"step-start", "step-finish", "snapshot"})


class OpenCodeHistoryError(Exception):
    """OpenCode's database cannot be read: missing, not SQLite, not OpenCode's, unknown id."""


def default_opencode_db() -> Path:
    """Where OpenCode keeps its database: ``$XDG_DATA_HOME/opencode`` or ``~/.local/share``."""
    data_home = os.environ.get("XDG_DATA_HOME")
    base = Path(data_home) if data_home else Path.home() / ".local" / "share"
    return base / "opencode" / DB_FILE


@dataclass(frozen=True)
class SessionInfo:
    id: str
    title: str
    directory: str
    parent_id: str | None
    time_created: int
    time_updated: int
    message_count: int

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "directory": self.directory,
            "parent_id": self.parent_id,
            "time_created": self.time_created,
            "time_updated": self.time_updated,
            "created": iso_time(self.time_created),
            "updated": iso_time(self.time_updated),
            "message_count": self.message_count,
        }


@dataclass(frozen=True)
class RenderedPart:
    type: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "text": self.text}


@dataclass(frozen=True)
class MessageView:
    id: str
    role: str
    time_created: int
    agent: str | None = None
    model: str | None = None
    summary: bool = False
    error: str | None = None
    parts: tuple[RenderedPart, ...] = field(default=())

    @property
    def text(self) -> str:
        lines = [part.text.rstrip() for part in self.parts]
        if self.error:
            lines.append(f"[error] {self.error}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "role": self.role,
            "time_created": self.time_created,
            "created": iso_time(self.time_created),
            "agent": self.agent,
            "model": self.model,
            "summary": self.summary,
            "error": self.error,
            "text": self.text,
            "parts": [part.to_json() for part in self.parts],
        }


@dataclass(frozen=True)
class StoredMessage:
    """A message as OpenCode stored it: its ``data`` and its parts' ``data``, in order
    (unreadable JSON left out), for a reader that needs every field (replay)."""

    id: str
    info: dict[str, Any]
    parts: tuple[dict[str, Any], ...]

    @property
    def role(self) -> str:
        return _str(self.info.get("role")) or "?"

    @property
    def provider(self) -> str | None:
        provider = _str(self.info.get("providerID"))
        nested = self.info.get("model")
        if provider is None and isinstance(nested, Mapping):
            provider = _str(nested.get("providerID"))
        return provider

    @property
    def model(self) -> str | None:
        """``provider/model`` as ``MessageView.model`` shows it."""
        return _model(self.info)


@dataclass(frozen=True)
class SearchHit:
    session_id: str
    session_title: str
    message_id: str
    role: str
    part_type: str
    time_created: int
    snippet: str

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "session_title": self.session_title,
            "message_id": self.message_id,
            "role": self.role,
            "part_type": self.part_type,
            "time_created": self.time_created,
            "created": iso_time(self.time_created),
            "snippet": self.snippet,
        }


def iso_time(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


class OpenCodeHistory:
    """A read-only view of one ``opencode.db``; never writes to it or next to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._check_file(path)
        self.connection = self._connect(path)
        try:
            self._check_schema()
        except BaseException:
            self.connection.close()
            raise

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> OpenCodeHistory:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------ opening

    @staticmethod
    def _check_file(path: Path) -> None:
        if not path.exists():
            raise OpenCodeHistoryError(f"no OpenCode database at {path}")
        if not path.is_file():
            raise OpenCodeHistoryError(f"{path} is not a file")
        try:
            with path.open("rb") as handle:
                header = handle.read(len(SQLITE_MAGIC))
        except OSError as exc:
            raise OpenCodeHistoryError(f"cannot read {path}: {exc.strerror or exc}") from None
        if header != SQLITE_MAGIC:
            raise OpenCodeHistoryError(f"{path} is not a SQLite database")

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        """Open without creating or changing any file.

        ``mode=ro`` on a WAL database creates ``-wal`` and ``-shm`` when they are absent and
        leaves them behind, so it is used only while a writer (OpenCode) holds them, to see
        its latest commits. With no live WAL every row is in the main file, and
        ``immutable=1`` reads it with no side files and no locks.
        """
        real = path.resolve()
        sidecars = (Path(f"{real}-wal"), Path(f"{real}-shm"))
        modes = ["immutable=1"]
        if all(sidecar.exists() for sidecar in sidecars):
            modes.insert(0, "mode=ro")
        failure: sqlite3.Error | None = None
        for mode in modes:
            try:
                connection = sqlite3.connect(f"{real.as_uri()}?{mode}", uri=True, timeout=2.0)
            except sqlite3.Error as exc:
                failure = exc
                continue
            connection.row_factory = sqlite3.Row
            try:
                connection.execute("PRAGMA query_only = ON")
                connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
            except sqlite3.Error as exc:
                connection.close()
                failure = exc
                continue
            return connection
        raise OpenCodeHistoryError(f"cannot open {path} read-only: {failure}")

    def _check_schema(self) -> None:
        for table, wanted in REQUIRED_COLUMNS.items():
            rows = self._query(f"PRAGMA table_info({table})")
            missing = wanted - {row["name"] for row in rows}
            if not rows:
                raise OpenCodeHistoryError(
                    f"{self.path} is not an OpenCode database (no {table!r} table)"
                )
            if missing:
                raise OpenCodeHistoryError(
                    f"{self.path} has an unknown OpenCode schema: table {table!r} lacks "
                    + ", ".join(sorted(missing))
                )

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self.connection.execute(sql, tuple(params)).fetchall()
        except sqlite3.Error as exc:
            raise OpenCodeHistoryError(f"cannot read {self.path}: {exc}") from None

    # ------------------------------------------------------------ sessions

    def sessions(
        self, directories: Iterable[str] = (), limit: int | None = None
    ) -> list[SessionInfo]:
        """Sessions, most recently updated first; ``directories``: in (or under) any of these."""
        where: list[str] = []
        params: list[Any] = []
        for directory in directories:
            base = directory.rstrip("/") or "/"
            prefix = base if base.endswith("/") else base + "/"
            where.append("(s.directory = ? OR substr(s.directory, 1, ?) = ?)")
            params += [base, len(prefix), prefix]
        sql = _SESSION_SELECT
        if where:
            sql += " WHERE " + " OR ".join(where)
        sql += " ORDER BY s.time_updated DESC, s.id DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [_session(row) for row in self._query(sql, params)]

    def session(self, session_id: str) -> SessionInfo:
        rows = self._query(_SESSION_SELECT + " WHERE s.id = ?", [session_id])
        if not rows:
            raise OpenCodeHistoryError(f"no session {session_id!r} in {self.path}")
        return _session(rows[0])

    # ------------------------------------------------------------ messages

    def messages(self, session_id: str, *, full: bool = False) -> list[MessageView]:
        """The session's messages in order, each rendered from its parts."""
        self.session(session_id)
        parts: dict[str, list[RenderedPart]] = {}
        for row in self._query(
            "SELECT message_id, data FROM part WHERE session_id = ? ORDER BY message_id, id",
            [session_id],
        ):
            rendered = render_part(_load(row["data"]), full=full)
            if rendered is not None:
                parts.setdefault(row["message_id"], []).append(rendered)
        views = []
        for row in self._query(
            "SELECT id, time_created, data FROM message WHERE session_id = ? "
            "ORDER BY time_created, id",
            [session_id],
        ):
            info = _load(row["data"]) or {}
            views.append(
                MessageView(
                    id=row["id"],
                    role=_str(info.get("role")) or "?",
                    time_created=_int(row["time_created"]),
                    agent=_str(info.get("agent")),
                    model=_model(info),
                    summary=info.get("summary") is True,
                    error=_error_text(info.get("error")),
                    parts=tuple(parts.get(row["id"], ())),
                )
            )
        return views

    def stored_messages(self, session_id: str) -> list[StoredMessage]:
        """The session's messages in order with their parts' whole JSON (``messages``
        renders them for people; this keeps tool inputs, outputs and reasoning as stored)."""
        self.session(session_id)
        parts: dict[str, list[dict[str, Any]]] = {}
        for row in self._query(
            "SELECT message_id, data FROM part WHERE session_id = ? ORDER BY message_id, id",
            [session_id],
        ):
            part = _load(row["data"])
            if part is not None:
                parts.setdefault(row["message_id"], []).append(part)
        return [
            StoredMessage(row["id"], _load(row["data"]) or {}, tuple(parts.get(row["id"], ())))
            for row in self._query(
                "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id",
                [session_id],
            )
        ]

    # ------------------------------------------------------------ search

    def search(
        self, query: str, *, session_id: str | None = None, limit: int = 20
    ) -> list[SearchHit]:
        """Parts whose text holds every term of ``query`` (case-insensitive), newest first."""
        words = query.split()
        terms = [word.casefold() for word in words]
        if not terms:
            raise OpenCodeHistoryError("empty search query")
        if session_id is not None:
            self.session(session_id)
        where = ["1"]
        params: list[Any] = []
        if session_id is not None:
            where.append("p.session_id = ?")
            params.append(session_id)
        for word in words:
            needle = _prefilter_needle(word)
            if needle is not None:
                where.append("instr(lower(p.data), ?) > 0")
                params.append(needle)
        sql = (
            "SELECT p.session_id, p.message_id, p.time_created, p.data, m.data AS message, "
            "s.title FROM part p LEFT JOIN message m ON m.id = p.message_id "
            "LEFT JOIN session s ON s.id = p.session_id WHERE "
            + " AND ".join(where)
            + " ORDER BY p.time_created DESC, p.id DESC"
        )
        hits: list[SearchHit] = []
        for row in self._iterate(sql, params):
            part = _load(row["data"])
            if part is None:
                continue
            text = searchable_text(part)
            folded = text.casefold()
            if not all(term in folded for term in terms):
                continue
            message = _load(row["message"]) or {}
            hits.append(
                SearchHit(
                    session_id=row["session_id"],
                    session_title=_str(row["title"]) or "",
                    message_id=row["message_id"],
                    role=_str(message.get("role")) or "?",
                    part_type=_part_label(part),
                    time_created=_int(row["time_created"]),
                    snippet=snippet(text, terms),
                )
            )
            if len(hits) >= limit:
                break
        return hits

    def _iterate(self, sql: str, params: Iterable[Any]) -> Iterator[sqlite3.Row]:
        try:
            yield from self.connection.execute(sql, tuple(params))
        except sqlite3.Error as exc:
            raise OpenCodeHistoryError(f"cannot read {self.path}: {exc}") from None


_SESSION_SELECT = (
    "SELECT s.id, s.title, s.directory, s.parent_id, s.time_created, s.time_updated, "
    "(SELECT count(*) FROM message m WHERE m.session_id = s.id) AS message_count FROM session s"
)


def _session(row: sqlite3.Row) -> SessionInfo:
    return SessionInfo(
        id=row["id"],
        title=_str(row["title"]) or "",
        directory=_str(row["directory"]) or "",
        parent_id=_str(row["parent_id"]),
        time_created=_int(row["time_created"]),
        time_updated=_int(row["time_updated"]),
        message_count=_int(row["message_count"]),
    )


# ---------------------------------------------------------------- rendering


def render_part(part: Mapping[str, Any] | None, *, full: bool = False) -> RenderedPart | None:
    """One line (or block) for a part; ``None`` for bookkeeping parts."""
    if part is None:
        return RenderedPart("?", "[unreadable part]")
    kind = _str(part.get("type")) or "?"
    if kind in SILENT_PARTS:
        return None
    if kind == "text":
        text = _str(part.get("text")) or ""
        if part.get("ignored") is True:
            return None
        return RenderedPart(kind, f"[synthetic] {text}" if part.get("synthetic") else text)
    if kind == "reasoning":
        text = _str(part.get("text")) or ""
        return RenderedPart(
            kind, "[reasoning] " + (text if full else shorten(text, REASONING_CHARS))
        )
    if kind == "tool":
        return RenderedPart(kind, _render_tool(part, full=full))
    if kind == "compaction":
        how = "auto" if part.get("auto") is True else "manual"
        return RenderedPart(kind, f"[compaction ({how})]")
    if kind == "patch":
        files = part.get("files")
        names = [str(name) for name in files] if isinstance(files, list) else []
        return RenderedPart(kind, "[patch] " + ", ".join(names))
    if kind == "file":
        name = _str(part.get("filename")) or _str(part.get("mime")) or "file"
        return RenderedPart(kind, f"[file] {name}")
    if kind == "agent":
        return RenderedPart(kind, f"[agent] {_str(part.get('name')) or '?'}")
    if kind == "subtask":
        agent = _str(part.get("agent")) or "?"
        return RenderedPart(kind, f"[subtask {agent}] {_str(part.get('description')) or ''}")
    if kind == "retry":
        return RenderedPart(
            kind, f"[retry {part.get('attempt')}] {_error_text(part.get('error')) or ''}".rstrip()
        )
    return RenderedPart(kind, f"[{kind}]")


def _render_tool(part: Mapping[str, Any], *, full: bool) -> str:
    name = _str(part.get("tool")) or "tool"
    state = part.get("state")
    state = state if isinstance(state, Mapping) else {}
    arguments = _compact_json(state.get("input", {}))
    if not full:
        arguments = shorten(arguments, TOOL_INPUT_CHARS)
    status = _str(state.get("status"))
    if status == "completed":
        result = _str(state.get("output")) or ""
    elif status == "error":
        result = "error: " + (_str(state.get("error")) or "")
    else:
        result = f"[{status or 'unknown'}]"
    if not full:
        result = shorten(result, TOOL_OUTPUT_CHARS)
    return f"{name}({arguments}) -> {result}"


def searchable_text(part: Mapping[str, Any]) -> str:
    """What a search looks at in a part: what was said, thought, called and answered."""
    kind = part.get("type")
    if kind in ("text", "reasoning"):
        return _str(part.get("text")) or ""
    if kind == "tool":
        state = part.get("state")
        state = state if isinstance(state, Mapping) else {}
        pieces = [
            _str(part.get("tool")) or "",
            _compact_json(state.get("input", {})),
            _str(state.get("output")) or "",
            _str(state.get("error")) or "",
        ]
        return "\n".join(piece for piece in pieces if piece)
    if kind == "subtask":
        return "\n".join(_str(part.get(key)) or "" for key in ("description", "prompt"))
    if kind == "patch":
        files = part.get("files")
        return "\n".join(str(name) for name in files) if isinstance(files, list) else ""
    if kind == "file":
        return _str(part.get("filename")) or ""
    return ""


def shorten(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: limit - 1].rstrip() + "…"


def snippet(text: str, terms: list[str], context: int = SNIPPET_CONTEXT) -> str:
    """The text, on one line, around the whole query if it occurs, else its longest term."""
    flat = " ".join(text.split())
    folded = flat.casefold()
    for term in [" ".join(terms), *sorted(terms, key=len, reverse=True)]:
        at = folded.find(term)
        if at >= 0:
            break
    else:
        return shorten(flat, 2 * context)
    # casefold can change lengths (ß -> ss); the cut only needs to be close.
    start = max(0, at - context)
    end = min(len(flat), at + len(term) + context)
    return ("…" if start else "") + flat[start:end] + ("…" if end < len(flat) else "")


def _prefilter_needle(word: str) -> str | None:
    """A substring that SQL can look for in the raw JSON, or None if SQL cannot tell.

    SQLite's ``lower`` folds only ASCII, and the JSON escapes quotes, backslashes and control
    characters, so only terms whose spelling survives both are filtered in SQL; the exact
    check always happens in Python on the decoded text.
    """
    for char in word:
        if char in '"\\' or ord(char) < 0x20:
            return None
        if not char.isascii() and char.lower() != char.upper():
            return None
    return word.lower()


def _load(raw: object) -> dict[str, Any] | None:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _part_label(part: Mapping[str, Any]) -> str:
    kind = _str(part.get("type")) or "?"
    if kind == "tool":
        return f"tool:{_str(part.get('tool')) or '?'}"
    return kind


def _model(info: Mapping[str, Any]) -> str | None:
    provider, model = _str(info.get("providerID")), _str(info.get("modelID"))
    nested = info.get("model")
    if model is None and isinstance(nested, Mapping):
        provider, model = _str(nested.get("providerID")), _str(nested.get("modelID"))
    if model is None:
        return None
    return f"{provider}/{model}" if provider else model


def _error_text(error: object) -> str | None:
    if error is None:
        return None
    if isinstance(error, str):
        return error
    if isinstance(error, Mapping):
        data = error.get("data")
        message = data.get("message") if isinstance(data, Mapping) else error.get("message")
        name = _str(error.get("name"))
        text = _str(message)
        if name and text:
            return f"{name}: {text}"
        return text or name or _compact_json(error)
    return str(error)


def _compact_json(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    except (TypeError, ValueError):
        return str(value)


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    return 0
