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


def _token_matches(request: web.Request, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Bytes, so that a token with non-ASCII characters is compared rather than a TypeError;
    # aiohttp decodes header bytes as UTF-8 with surrogateescape, which this undoes.
    return hmac.compare_digest(
        given.strip().encode("utf-8", "surrogateescape"), token.encode("utf-8", "surrogateescape")
    )


def admin_allowed(request: web.Request, settings: Settings) -> bool:
    """Loopback clients, or anyone presenting the configured admin token."""
    token = settings.admin_token
    if token and _token_matches(request, token):
        return True
    return is_loopback(request.remote)


def admin_refusal(request: web.Request, settings: Settings) -> web.Response | None:
    """None when the caller may use the admin endpoints; else 401 when a token is configured
    (it is missing or wrong) and 403 when there is none to present."""
    if admin_allowed(request, settings):
        return None
    if not settings.admin_token:
        return error_response(
            403,
            "admin endpoints answer loopback clients only; configure an admin token "
            "(--admin-token / DEEP_MEMORY_ADMIN_TOKEN) and send it as 'Authorization: Bearer "
            "TOKEN' to reach them from elsewhere",
            "forbidden",
            "admin_only",
        )
    response = error_response(
        401,
        "admin endpoints need the admin token from this address: send it as "
        "'Authorization: Bearer TOKEN' (a missing or wrong token gets this answer)",
        "unauthorized",
        "admin_token_required",
    )
    response.headers["WWW-Authenticate"] = 'Bearer realm="deepmem"'
    return response
