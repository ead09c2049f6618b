"""The request guard: one middleware decides which requests deepmem answers at all.

Each route has an ``Access`` kind (``create_app`` names them; a route it does not name is
``ADMIN``):

- ``PUBLIC`` (``/health``): anyone, from anywhere; liveness probes send any ``Host``. It shows
  no credentials (upstream URLs are redacted).
- ``PAGE`` (``/``): a ``Host`` that is loopback or allowed, and not a cross-site request
  (a top-level navigation to the page is fine: it holds no data).
- ``ADMIN`` (``/stats``, ``/metrics``, ``/expand``, ``/mcp``, ``/memory``, ``/sessions``): as
  ``PAGE`` without the navigation exception, from loopback or with the admin token, and a
  request with a body must say ``Content-Type: application/json`` (``text/markdown`` too for
  ``/memory/import``). Browsers cannot send that type cross-origin without a CORS preflight,
  which deepmem never grants.
- ``PROXIED`` (``/{upstream}/...``): clients that are not browsers (OpenCode, SDKs, curl,
  other containers) pass with any ``Host``. A request a browser made (it carries ``Origin`` or
  ``Sec-Fetch-Site``) must pass the ``PAGE`` checks, so that no web page can make deepmem
  capture notes or write checkpoints through a chat request, even by DNS rebinding.

The ``Host`` check defeats DNS rebinding: a page on ``evil.example`` that rebinds its name to
127.0.0.1 still sends ``Host: evil.example``.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_urldispatcher import AbstractResource
from yarl import URL

from compressors.wire import error_body, error_style
from proxy.admin import admin_refusal, error_response
from proxy.config import Settings


class Access(enum.Enum):
    PUBLIC = "public"
    PAGE = "page"
    ADMIN = "admin"
    PROXIED = "proxied"


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSON = "application/json"
# Sec-Fetch-Site values of requests no other site started: the page itself, or the user.
OWN_SITE = frozenset({"same-origin", "none"})
WILDCARD_BIND = frozenset({"", "0.0.0.0", "::", "[::]"})


def _split_host(host: str) -> tuple[str, str | None]:
    """``name[:port]`` or ``[v6]:port`` into a lower-case name (no brackets) and the port."""
    host = host.strip().lower()
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name.rstrip("."), port
    return host.rstrip("."), None


def _is_loopback_name(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True  # browsers resolve these to loopback themselves; no page can rebind them
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def host_allowed(host: str | None, settings: Settings) -> bool:
    """A ``Host`` naming loopback, the address deepmem binds, or a name in ``allowed_hosts``.
    No ``Host`` at all is no name a browser could have rebound (browsers always send it)."""
    if host is None:
        return True
    name, port = _split_host(host)
    if _is_loopback_name(name):
        return True
    allowed = set(settings.allowed_hosts)
    if settings.host.lower() not in WILDCARD_BIND:
        allowed.add(settings.host.lower().strip("[]"))
    candidates = {name, f"[{name}]"}
    if port is not None:
        candidates |= {f"{name}:{port}", f"[{name}]:{port}"}
    return "*" in allowed or not allowed.isdisjoint(candidates)


def _same_origin(origin: str, host: str | None) -> bool:
    """``Origin`` names the host and port the request was sent to (the scheme may differ
    behind a TLS-terminating proxy; nothing else can serve on deepmem's host and port)."""
    if host is None or origin.strip().lower() == "null":
        return False
    try:
        url = URL(origin.strip())
    except ValueError:
        return False
    if not url.absolute or not url.host:
        return False
    port = url.explicit_port
    return (url.host.lower().rstrip("."), str(port) if port else None) == _split_host(host)


def cross_site(request: web.Request) -> str | None:
    """Why the request looks started by another site, or None."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.strip().lower() not in OWN_SITE:
        return f"Sec-Fetch-Site: {site}"
    origin = request.headers.get("Origin")
    if origin is not None and not _same_origin(origin, request.headers.get("Host")):
        return f"Origin: {origin}"
    return None


def _from_browser(request: web.Request) -> bool:
    return "Origin" in request.headers or "Sec-Fetch-Site" in request.headers


def _is_navigation(request: web.Request) -> bool:
    return (
        request.method in ("GET", "HEAD")
        and request.headers.get("Sec-Fetch-Mode", "").lower() == "navigate"
    )


def _accepted_body_types(request: web.Request) -> tuple[str, ...]:
    return (JSON, "text/markdown") if request.path == "/memory/import" else (JSON,)


def refusal(
    request: web.Request, access: Access, settings: Settings
) -> tuple[int, str, str] | None:
    """(status, message, code) when the Host or the request's origin is refused, else None.
    The admin token is checked after these and before the body's type."""
    if access is Access.PUBLIC or (access is Access.PROXIED and not _from_browser(request)):
        return None
    host = request.headers.get("Host")
    if not host_allowed(host, settings):
        return (
            403,
            f"deepmem does not answer for Host {host!r}: only loopback names and allowed_hosts "
            "(--allowed-hosts / DEEP_MEMORY_ALLOWED_HOSTS) are served",
            "host_not_allowed",
        )
    if not (access is Access.PAGE and _is_navigation(request)):
        reason = cross_site(request)
        if reason is not None:
            return (
                403,
                f"deepmem refuses requests another site started ({reason}); its endpoints "
                "answer same-origin requests and clients that are not browsers",
                "cross_site",
            )
    return None


def _body_type_refusal(request: web.Request) -> web.Response | None:
    accepted = _accepted_body_types(request)
    if request.method not in BODY_METHODS or request.content_type in accepted:
        return None
    return error_response(
        415,
        f"send the body as Content-Type: {' or '.join(accepted)} "
        f"(got {request.headers.get('Content-Type', 'none')!r})",
        "unsupported_media_type",
        "unsupported_media_type",
    )


def guard(settings: Settings, access: Mapping[AbstractResource, Access]) -> Middleware:
    """The middleware; ``access`` names the kind of each resource (default ``ADMIN``)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        kind = access.get(resource, Access.ADMIN) if resource is not None else Access.ADMIN
        refused = refusal(request, kind, settings)
        if refused is not None:
            status, message, code = refused
            if kind is Access.PROXIED:
                style = error_style("/" + request.match_info.get("tail", ""), request.headers)
                return web.Response(
                    body=error_body(style, "deepmem: " + message, "permission_error", code),
                    status=status,
                    content_type="application/json",
                )
            return error_response(status, message, "forbidden", code)
        if kind is Access.ADMIN:
            answer = admin_refusal(request, settings) or _body_type_refusal(request)
            if answer is not None:
                return answer
        return await handler(request)

    return middleware
