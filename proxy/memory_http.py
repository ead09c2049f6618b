"""``/memory/...``: the memory operations over HTTP, for scripts (admin endpoints).

One route per CLI subcommand, same names and the same project rule as the MCP tools
(``proxy.projects``); ``?project=DIR`` or the ``X-Deep-Memory-Project`` header names the
project, ``?scope=global`` the global memory.

    GET  /memory/search?q=TEXT[&limit=N]
    GET  /memory/list[?section=NAME]
    GET  /memory/stats
    GET  /memory/export[?format=json|markdown]
    POST /memory/store     {"section": ..., "text": ...}
    POST /memory/forget    {"ids": [...]} or {"query": ...}, "confirm": false|true
    POST /memory/import[?force=true]   body: a JSON or Markdown export
    POST /memory/cleanup   {"older_than_days": N, "section": ..., "ids": [...], "dry_run": true}

and the compaction archive: ``GET /sessions/{sid}/checkpoint`` and
``GET /sessions/{sid}/messages/{n}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from memory.archive import ArchiveError, archived_message, session_checkpoints
from memory.catalog import ProjectMemory
from memory.files import LockTimeout
from memory.project import PROJECT_HEADER
from memory.state import StateUnavailable
from proxy import memory_api
from proxy.admin import error_response, json_response
from proxy.config import Settings
from proxy.memory_api import MemoryCallError, MemoryService
from proxy.projects import AmbiguousProject, ProjectChoice
from proxy.request_body import UnreadableBody, read_body

# How long a read of a session's archive waits for the checkpoints still being written.
ARCHIVE_READ_WAIT_SECONDS = 10.0

Operation = Callable[[web.Request, ProjectMemory, ProjectChoice, dict[str, Any]], Any]


def _flag(raw: str | None) -> bool:
    return (raw or "").strip().lower() in ("1", "true", "yes", "on")


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise MemoryCallError(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise MemoryCallError("body must be a JSON object")
    return body


def _search(request: web.Request, memory: ProjectMemory, choice: ProjectChoice, _: Any) -> Any:
    q = request.query
    return memory_api.search(memory, choice, q.get("q", q.get("query")), q.get("limit"))


def _list(request: web.Request, memory: ProjectMemory, choice: ProjectChoice, _: Any) -> Any:
    return memory_api.list_entries(memory, choice, request.query.get("section"))


def _stats(request: web.Request, memory: ProjectMemory, choice: ProjectChoice, _: Any) -> Any:
    return memory_api.stats(memory, choice)


def _export(request: web.Request, memory: ProjectMemory, choice: ProjectChoice, _: Any) -> Any:
    text, content_type = memory_api.export(memory, request.query.get("format"))
    return web.Response(text=text, content_type=content_type, charset="utf-8")


def _store(_: web.Request, memory: ProjectMemory, choice: ProjectChoice, body: Any) -> Any:
    return memory_api.store(memory, choice, body.get("section"), body.get("text"))


def _forget(_: web.Request, memory: ProjectMemory, choice: ProjectChoice, body: Any) -> Any:
    return memory_api.forget(
        memory, choice, body.get("ids"), body.get("query"), body.get("confirm", False)
    )


def _cleanup(_: web.Request, memory: ProjectMemory, choice: ProjectChoice, body: Any) -> Any:
    return memory_api.cleanup(
        memory,
        choice,
        body.get("older_than_days"),
        body.get("section"),
        body.get("ids"),
        body.get("dry_run", True),
    )


GET_OPERATIONS: dict[str, Operation] = {
    "search": _search,
    "list": _list,
    "stats": _stats,
    "export": _export,
}
POST_OPERATIONS: dict[str, Operation] = {
    "store": _store,
    "forget": _forget,
    "cleanup": _cleanup,
}


def memory_handler(
    service: MemoryService, on_call: Callable[[str, int], None]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of ``/memory/{operation}``; ``on_call(operation, status)`` counts calls.
    Who may call it is decided before it runs (``proxy.security``)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["operation"]
        response = await _dispatch(request, name, service)
        on_call(name, response.status)
        return response

    return handle


async def _dispatch(request: web.Request, name: str, service: MemoryService) -> web.StreamResponse:
    table = GET_OPERATIONS if request.method == "GET" else POST_OPERATIONS
    if name not in GET_OPERATIONS and name not in POST_OPERATIONS and name != "import":
        known = ", ".join([*GET_OPERATIONS, *POST_OPERATIONS, "import"])
        return error_response(
            404, f"no memory operation {name!r} (known: {known})", "not_found", "unknown_operation"
        )
    expected = "GET" if name in GET_OPERATIONS else "POST"
    if request.method != expected:
        return web.Response(status=405, headers={"Allow": expected})
    q = request.query
    try:
        if name == "import":
            data = (await read_body(request)).decode("utf-8")

            def run_import() -> Any:
                memory, choice = service.choose(
                    q.get("project"), _endpoint(request), q.get("scope", "project")
                )
                return memory_api.import_(memory, choice, data, _flag(q.get("force")))

            return json_response(await asyncio.to_thread(run_import))
        body = await _json_body(request) if expected == "POST" else {}

        def run() -> Any:
            memory, choice = service.choose(
                body.get("project", q.get("project")),
                _endpoint(request),
                body.get("scope", q.get("scope", "project")),
            )
            return table[name](request, memory, choice, body)

        # Memory files, their locks and the search index: off the event loop.
        result = await asyncio.to_thread(run)
    except AmbiguousProject as exc:
        return error_response(409, str(exc), "ambiguous_project", "ambiguous_project")
    except (MemoryCallError, UnicodeDecodeError, UnreadableBody) as exc:
        return error_response(400, str(exc), "invalid_request", "bad_memory_request")
    except (OSError, LockTimeout) as exc:
        return error_response(
            500, f"cannot read or write the memory files: {exc}", "server_error", "memory_io"
        )
    return result if isinstance(result, web.StreamResponse) else json_response(result)


def _endpoint(request: web.Request) -> str | None:
    return request.headers.get(PROJECT_HEADER) or None


def session_handler(
    service: MemoryService, settings: Settings
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``GET /sessions/{sid}/messages/{n}``: message ``n`` (0-based) of the session's newest
    archived history; ``GET /sessions/{sid}/checkpoint``: its newest checkpoint.md.

    The project is ``?project=DIR`` or the header, else the one the session's requests named,
    else ``project_dir``, else the global memory.
    """

    async def handle(request: web.Request) -> web.StreamResponse:
        return await asyncio.to_thread(_session_answer, request, service, settings)

    return handle


def _session_answer(
    request: web.Request, service: MemoryService, settings: Settings
) -> web.StreamResponse:
    """The archive read behind ``session_handler``, on a worker thread, once the checkpoints
    being written (a compaction just answered: ``MemoryCatalog.writes``) are on disk."""
    service.catalog.writes.drain(ARCHIVE_READ_WAIT_SECONDS)
    session_id = request.match_info["sid"]
    named = request.query.get("project") or _endpoint(request)
    try:
        project = (
            service.projects.check(named, "project")
            if named
            else service.projects.for_session(session_id) or settings.project_dir
        )
    except ValueError as exc:
        return error_response(400, str(exc), "invalid_request", "bad_project")
    except StateUnavailable as exc:  # the session's project lives in a shared backend, away
        return error_response(503, str(exc), "state_unavailable", "state_unavailable")
    memory = service.catalog.get(project)
    memory_dir = memory.memory_dir or memory.global_dir
    what = request.match_info.get("n")
    try:
        if what is None:
            archives = session_checkpoints(memory_dir, session_id)
            if not archives:
                raise ArchiveError(f"no checkpoint for session {session_id!r} in {memory_dir}")
            text = archives[0].checkpoint.read_text(encoding="utf-8")
            return web.Response(text=text, content_type="text/markdown", charset="utf-8")
        # isdigit alone accepts "²", which int() refuses; int() refuses 4,300 digits too
        if not (what.isascii() and what.isdigit() and len(what) <= 18):
            return error_response(
                400,
                "the message number must be 0 or more, in at most 18 ASCII digits",
                "invalid_request",
                "bad_index",
            )
        return json_response(archived_message(memory_dir, session_id, int(what)))
    except ArchiveError as exc:
        return error_response(
            404,
            f"{exc.args[0]}; name the project with ?project=DIR if it is another one",
            "not_found",
            "not_archived",
        )
    except (OSError, ValueError) as exc:
        return error_response(500, f"cannot read the archive: {exc}", "server_error", "io")
