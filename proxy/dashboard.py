"""The status dashboard at ``/``: one self-contained page, and the session detail it polls.

The page holds no data; it reads the admin-only ``/stats`` (totals and sessions) and
``/stats?session=ID`` (one session with its recent requests) from the browser, so it works
from loopback as it is and from elsewhere with the admin token (the page asks for it); either
way under a loopback name or one in ``allowed_hosts`` (``proxy.security``).
Scripts keep the JSON index: ``Accept: application/json`` or ``?format=json``.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from functools import lru_cache
from importlib import resources

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PAGE = "dashboard.html"
_INLINE = re.compile(rb"<(script|style)>(.*?)</\1>", re.DOTALL)


def wants_page(request: web.Request) -> bool:
    """HTML for browsers (or ``?format=html``); JSON for ``?format=json`` and for any client
    that does not prefer text/html over application/json (curl's ``*/*`` included)."""
    chosen = request.query.get("format", "").lower()
    if chosen in ("html", "json"):
        return chosen == "html"
    quality = _accept_qualities(request.headers.get("Accept", ""))
    html = quality.get("text/html", 0.0)
    return html > 0 and html >= quality.get("application/json", 0.0)


def _accept_qualities(accept: str) -> dict[str, float]:
    qualities: dict[str, float] = {}
    for part in accept.split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if media:
            qualities[media.lower()] = max(quality, qualities.get(media.lower(), 0.0))
    return qualities


@lru_cache(maxsize=1)
def _page() -> tuple[bytes, str]:
    """The page and its Content-Security-Policy, which allows exactly its inline code."""
    body = resources.files("proxy").joinpath("static", PAGE).read_bytes()
    hashes: dict[str, list[str]] = {"script": [], "style": []}
    for match in _INLINE.finditer(body):
        digest = base64.b64encode(hashlib.sha256(match.group(2)).digest()).decode()
        hashes[match.group(1).decode()].append(f"'sha256-{digest}'")
    policy = "; ".join(
        [
            "default-src 'none'",
            "script-src " + " ".join(hashes["script"]),
            "style-src " + " ".join(hashes["style"]),
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    return body, policy


def page_response() -> web.Response:
    body, policy = _page()
    return web.Response(
        body=body,
        content_type="text/html",
        charset="utf-8",
        headers={
            "Content-Security-Policy": policy,
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Vary": "Accept",
        },
    )
