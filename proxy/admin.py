"""Who may reach the admin endpoints, and the JSON answers they give."""

from __future__ import annotations

import hmac
import ipaddress

import orjson
from aiohttp import web

from proxy.config import Settings


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_INDENT_2),
        status=status,
        content_type="application/json",
    )


def error_response(status: int, message: str, error_type: str, code: str) -> web.Response:
    return json_response({"error": {"message": message, "type": error_type, "code": code}}, status)


def is_loopback(remote: str | None) -> bool:
    if not remote:
        return False
    try:
        return ipaddress.ip_address(remote.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def admin_allowed(request: web.Request, settings: Settings) -> bool:
    """Loopback clients, or anyone presenting the configured admin token."""
    token = settings.admin_token
    if token:
        given = request.headers.get("Authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), token):
            return True
    return is_loopback(request.remote)


def forbidden() -> web.Response:
    return error_response(
        403,
        "admin endpoints answer loopback clients only; configure an admin token "
        "(--admin-token / DEEP_MEMORY_ADMIN_TOKEN) and send it as 'Authorization: Bearer "
        "TOKEN' to reach them from elsewhere",
        "forbidden",
        "admin_only",
    )
