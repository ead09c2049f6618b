"""A Model Context Protocol server (streamable HTTP, JSON responses) at ``/mcp``.

OpenCode mounts it as a remote MCP server and runs its tools itself: the proxy never
intercepts streams or injects tools the client cannot execute. Tools are registered in
``TOOLS``; each handler takes the arguments and returns the text result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from memory.ccr import OriginalStore
from proxy import __version__
from proxy.expand import expand

log = logging.getLogger("deepmem.mcp")

PROTOCOL_VERSIONS = ("2025-06-18", "2025-03-26", "2024-11-05")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602


class ToolError(Exception):
    """A tool call that failed in a way the model should read (``isError: true``)."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    input_schema: dict[str, Any]
    run: Callable[[OriginalStore, dict[str, Any]], str]


def _deep_expand(store: OriginalStore, arguments: dict[str, Any]) -> str:
    key = arguments.get("key")
    if not isinstance(key, str):
        raise ToolError("deep_expand needs 'key', the ccr:… key a deep-memory marker names")
    start, end = arguments.get("start_line"), arguments.get("end_line")
    for name, value in (("start_line", start), ("end_line", end)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ToolError(f"{name} must be a positive line number")
    result = expand(store, key, start, end)
    if result.content is None:
        raise ToolError(result.error or "unknown key")
    return result.content.decode("utf-8", "replace")


TOOLS: tuple[Tool, ...] = (
    Tool(
        "deep_expand",
        "Return the original, complete text that a '[deep-memory: … — original intact: "
        'deep_expand("ccr:…")]\' marker stands for (an omitted tool output, a removed '
        "reminder). Pass the key from the marker; optionally start_line/end_line (1-based, "
        "inclusive) to get part of a long original.",
        {
            "type": "object",
            "properties": {
                "key": {"type": "string", "description": "the key from the marker: ccr:<24 hex>"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["key"],
        },
        _deep_expand,
    ),
)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}


def _result(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


ToolCallback = Callable[[str, bool], None]  # (tool name, failed)


def handle_message(
    store: OriginalStore, message: Any, on_tool_call: ToolCallback | None = None
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
                "deep_expand with the marker's key.",
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
            text, is_error = tool.run(store, arguments), False
        except ToolError as exc:
            text, is_error = str(exc), True
        if on_tool_call is not None:
            on_tool_call(tool.name, is_error)
        return _result(
            request_id, {"content": [{"type": "text", "text": text}], "isError": is_error}
        )
    return _error(request_id, METHOD_NOT_FOUND, f"method {method!r} is not supported")


async def mcp_post(
    request: web.Request, store: OriginalStore, on_tool_call: ToolCallback | None = None
) -> web.Response:
    try:
        payload = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return _json(_error(None, PARSE_ERROR, "body is not JSON"), status=400)
    if isinstance(payload, list):
        answers = [
            a for a in (handle_message(store, m, on_tool_call) for m in payload) if a is not None
        ]
        return _json(answers) if answers else web.Response(status=202)
    answer = handle_message(store, payload, on_tool_call)
    if answer is None:
        return web.Response(status=202)
    return _json(answer)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")
