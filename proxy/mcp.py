"""A Model Context Protocol server (streamable HTTP, JSON responses) at ``/mcp``.

OpenCode mounts it as a remote MCP server and runs its tools itself: the proxy never
intercepts streams or injects tools the client cannot execute. Tools are registered in
``TOOLS``; each handler takes the call's context and arguments and returns the text result.

A memory tool call carries no working directory. Its project is chosen by one rule
(``proxy.projects``): the call's ``project`` argument, else the endpoint's own project
(``/mcp?project=DIR`` or an ``X-Deep-Memory-Project`` header in the MCP config), else the
configured ``project_dir``, else the one project of the recently active sessions; when
several are active the call is refused with their list. Every answer names the project used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from memory.files import LockTimeout
from memory.interfaces import Originals
from memory.state import StateUnavailable
from memory.store import SECTIONS
from proxy import __version__, memory_api
from proxy.expand import LINE_RANGE_HELP, expand
from proxy.memory_api import MemoryCallError, MemoryService
from proxy.projects import AmbiguousProject
from proxy.request_body import UnreadableBody, read_body

log = logging.getLogger("deepmem.mcp")

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


class ToolError(Exception):
    """A tool call that failed in a way the model should read (``isError: true``)."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool call can reach: the originals, project memory and the endpoint's project."""

    originals: Originals
    memory: MemoryService | None = None
    endpoint_project: str | None = None


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[ToolContext, dict[str, Any]], str]


def _deep_expand(context: ToolContext, arguments: dict[str, Any]) -> str:
    key = arguments.get("key")
    if not isinstance(key, str):
        raise ToolError("deep_expand needs 'key', the ccr:… key a deep-memory marker names")
    start, end = arguments.get("start_line"), arguments.get("end_line")
    for name, value in (("start_line", start), ("end_line", end)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ToolError(f"{name} must be a line number (an integer)")
    try:
        result = expand(context.originals, key, start, end)
    except StateUnavailable as exc:
        raise ToolError(f"cannot expand {key} now: {exc} (deepmem's /health shows why)") from exc
    if result.content is None:
        raise ToolError(result.error or "unknown key")
    return result.content.decode("utf-8", "replace")


def _memory_call(
    context: ToolContext, arguments: dict[str, Any], run: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    if context.memory is None:
        raise ToolError("project memory is not available on this proxy")
    try:
        memory, choice = context.memory.choose(
            arguments.get("project"), context.endpoint_project, arguments.get("scope", "project")
        )
        return run(memory, choice)
    except (MemoryCallError, AmbiguousProject) as exc:
        raise ToolError(str(exc)) from exc
    except (OSError, LockTimeout) as exc:
        raise ToolError(f"cannot read or write the memory files: {exc}") from exc


def _where(result: dict[str, Any]) -> str:
    project = result["project"] or "no project (global memory)"
    return f"{project} [{result['memory_dir']}; chosen by {result['chosen_by']}]"


def _memory_search(context: ToolContext, arguments: dict[str, Any]) -> str:
    result = _memory_call(
        context,
        arguments,
        lambda m, c: memory_api.search(m, c, arguments.get("query"), arguments.get("limit")),
    )
    if not result["results"]:
        return f"No memory matches {result['query']!r} in {_where(result)}."
    lines = [f"Memory matching {result['query']!r} in {_where(result)}:"]
    for hit in result["results"]:
        dated = f" [{hit['date']}]" if hit["date"] else ""
        lines.append(
            f"- ({hit['section']}) {hit['text']}{dated}  ({hit['path']}:{hit['line']}, "
            f"score {hit['score']:.2f})"
        )
    return "\n".join(lines)


def _memory_store(context: ToolContext, arguments: dict[str, Any]) -> str:
    result = _memory_call(
        context,
        arguments,
        lambda m, c: memory_api.store(m, c, arguments.get("section"), arguments.get("text")),
    )
    entry = result["entry"]
    if result["stored"]:
        return f"Stored [{entry['id']}] in {entry['section']} of {_where(result)}."
    return f"Not stored: {result['reason']} ({_where(result)})."


def _memory_forget(context: ToolContext, arguments: dict[str, Any]) -> str:
    confirm = arguments.get("confirm", False)
    result = _memory_call(
        context,
        arguments,
        lambda m, c: memory_api.forget(m, c, arguments.get("ids"), arguments.get("query"), confirm),
    )
    matched = result["matched"]
    listing = "\n".join(f"- [{e['id']}] ({e['section']}) {e['text']}" for e in matched)
    if not matched:
        return f"Nothing matches in {_where(result)}; nothing was removed."
    if not result["removed"]:
        return (
            f"Preview: {len(matched)} entr{'y' if len(matched) == 1 else 'ies'} would be removed "
            f"from {_where(result)}:\n{listing}\nNothing was removed. To remove exactly these, "
            "call memory_forget again with ids set to these ids and confirm: true."
        )
    return f"Removed {len(matched)} from {_where(result)}:\n{listing}"


_PROJECT_ARGS: dict[str, Any] = {
    "project": {
        "type": "string",
        "description": "absolute path of the project; needed only when the proxy serves "
        "sessions of several projects at once",
    },
    "scope": {
        "type": "string",
        "enum": ["project", "global"],
        "description": "'global' uses the memory shared by all projects",
    },
}


TOOLS: tuple[Tool, ...] = (
    Tool(
        "deep_expand",
        "Return the original, complete text that a '[deep-memory: … — original intact: "
        'deep_expand("ccr:…")]\' marker stands for (an omitted tool output, a removed '
        "reminder). Pass the key from the marker; optionally start_line and/or end_line to get "
        "part of a long original: " + LINE_RANGE_HELP + ".",
        {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "the key from the marker: ccr:<24 hex>"},
                "start_line": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "first line: the line number shown in the file view",
                },
                "end_line": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "last line (inclusive): the line number shown in the file view",
                },
            },
            "required": ["key"],
        },
        _deep_expand,
    ),
    Tool(
        "memory_search",
        "Search the project's long-term memory (decisions, constraints, gotchas, facts, notes "
        "and compaction checkpoints of earlier sessions) with BM25; works for English and "
        "Chinese. Separate alternative phrasings with '|'.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "maximum": memory_api.MAX_LIMIT},
                **_PROJECT_ARGS,
            },
            "required": ["query"],
        },
        _memory_search,
    ),
    Tool(
        "memory_store",
        "Save one short, self-contained line to the project's long-term memory so later "
        "sessions know it: a decision and its reason, a constraint, a gotcha, a fact. "
        "Duplicates and near-duplicates are refused with the entry they repeat.",
        {
            "type": "object",
            "properties": {
                "section": {"type": "string", "enum": list(SECTIONS)},
                "text": {"type": "string"},
                **_PROJECT_ARGS,
            },
            "required": ["section", "text"],
        },
        _memory_store,
    ),
    Tool(
        "memory_forget",
        "Remove entries from the project's long-term memory. Without confirm it only "
        "previews what matches; call again with the previewed ids and confirm: true to delete.",
        {
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "string"}},
                "query": {"type": "string", "description": "text the entries contain"},
                "confirm": {"type": "boolean", "default": False},
                **_PROJECT_ARGS,
            },
        },
        _memory_forget,
    ),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}


def _result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


ToolCallback = Callable[[str, bool], None]  # (tool name, failed)


def handle_message(
    context: ToolContext, message: Any, on_tool_call: ToolCallback | None = None
) -> dict[str, Any] | None:
    """One JSON-RPC message in, its response out (None for notifications)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _error(None, INVALID_REQUEST, "expected a JSON-RPC 2.0 message")
    method = message.get("method")
    if "id" not in message:
        return None  # a notification (initialized, cancelled, …) needs no answer
    request_id = message["id"]
    params = message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion") if isinstance(params, dict) else None
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        return _result(
            request_id,
            {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "deepmem", "version": __version__},
                "instructions": "deepmem keeps the originals of compressed context. When a "
                "message shows a [deep-memory: …] marker and you need what it left out, call "
                "deep_expand with the marker's key. memory_search, memory_store and "
                "memory_forget read and write the project's long-term memory.",
            },
        )
    if method == "ping":
        return _result(request_id, {})
    if method == "tools/list":
        return _result(
            request_id,
            {
                "tools": [
                    {"name": t.name, "description": t.description, "inputSchema": t.input_schema}
                    for t in TOOLS
                ]
            },
        )
    if method == "tools/call":
        name = params.get("name") if isinstance(params, dict) else None
        tool = TOOLS_BY_NAME.get(name) if isinstance(name, str) else None
        if tool is None:
            return _error(request_id, INVALID_PARAMS, f"unknown tool {name!r}")
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            return _error(request_id, INVALID_PARAMS, "arguments must be an object")
        try:
            text, is_error = tool.run(context, arguments), False
        except ToolError as exc:
            text, is_error = str(exc), True
        if on_tool_call is not None:
            on_tool_call(tool.name, is_error)
        return _result(
            request_id, {"content": [{"type": "text", "text": text}], "isError": is_error}
        )
    return _error(request_id, METHOD_NOT_FOUND, f"method {method!r} is not supported")


async def mcp_post(
    request: web.Request, context: ToolContext, on_tool_call: ToolCallback | None = None
) -> web.Response:
    try:
        payload = orjson.loads(await read_body(request))
    except UnreadableBody as exc:
        return _json(_error(None, PARSE_ERROR, str(exc)), status=400)
    except orjson.JSONDecodeError:
        return _json(_error(None, PARSE_ERROR, "body is not JSON"), status=400)
    # Tools read and write memory files and the state database: off the event loop, with
    # the count reported back on it.
    loop = asyncio.get_running_loop()

    def counted(tool: str, failed: bool) -> None:
        if on_tool_call is not None:
            loop.call_soon_threadsafe(on_tool_call, tool, failed)

    messages = payload if isinstance(payload, list) else [payload]
    answers = await asyncio.to_thread(
        lambda: [handle_message(context, message, counted) for message in messages]
    )
    if isinstance(payload, list):
        found = [a for a in answers if a is not None]
        return _json(found) if found else web.Response(status=202)
    answer = answers[0]
    if answer is None:
        return web.Response(status=202)
    return _json(answer)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
