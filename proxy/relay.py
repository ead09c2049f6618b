"""The upstream side: pooled client sessions, header hygiene and the chunk-by-chunk relay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from compressors.view import Dialect
from compressors.wire import sse_error_event
from proxy.config import Settings
from proxy.opt_out import OPT_OUT_HEADER
from proxy.usage import UsageReader

# RFC 9110 section 7.6.1, plus the headers the proxy sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)


def _connection_tokens(headers: CIMultiDictProxy[str]) -> set[str]:
    return {
        token.strip().lower()
        for value in headers.getall("Connection", ())
        for token in value.split(",")
        if token.strip()
    }


# What never goes upstream from the client's headers (lower case), with and without the body's
# length (a re-sent body has its own).
_NOT_FORWARDED = HOP_BY_HOP | {"host", OPT_OUT_HEADER}
_NOT_FORWARDED_NOR_LENGTH = _NOT_FORWARDED | {"content-length"}


def upstream_request_headers(
    headers: CIMultiDictProxy[str], *, keep_content_length: bool
) -> CIMultiDict[str]:
    """The client's headers, byte for byte, less hop-by-hop ones, ``Host``, deepmem's own
    ``x-deep-memory`` and (when the body is re-sent by the proxy) ``Content-Length``."""
    drop = _NOT_FORWARDED if keep_content_length else _NOT_FORWARDED_NOR_LENGTH
    if "Connection" in headers:
        drop = drop | _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


def client_response_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    drop = (HOP_BY_HOP | _connection_tokens(headers)) if "Connection" in headers else HOP_BY_HOP
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


class UpstreamPool:
    """One keep-alive ``ClientSession`` per upstream, created on start-up, closed on shutdown."""

    # aiohttp adds these unless told not to; the client's own values are forwarded instead.
    SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._sessions: dict[str, aiohttp.ClientSession] = {}

    async def start(self) -> None:
        # ``connect`` would also count the wait for a free pooled connection: left unbounded,
        # so a full pool queues requests instead of failing them as upstream timeouts;
        # ``sock_connect`` bounds opening the connection itself.
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=None,
            sock_connect=self.settings.connect_timeout,
            sock_read=self.settings.read_timeout,
        )
        for upstream in self.settings.upstreams:
            connector = aiohttp.TCPConnector(
                limit=self.settings.upstream_pool_size,  # 0: no limit
                limit_per_host=self.settings.upstream_pool_size,
                keepalive_timeout=30,
                enable_cleanup_closed=True,
            )
            self._sessions[upstream.name] = aiohttp.ClientSession(
                connector=connector,
                # No jar: a cookie the upstream sets goes to the client that asked, and never
                # with another client's request.
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=timeout,
                auto_decompress=False,
                skip_auto_headers=self.SKIP_AUTO_HEADERS,
                read_bufsize=2**18,
                max_line_size=2**20,
                max_field_size=2**20,
            )

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()

    def session(self, name: str) -> aiohttp.ClientSession:
        return self._sessions[name]


@dataclass(slots=True)
class RelayResult:
    bytes_sent: int = 0
    interrupted: str | None = None  # why the upstream body broke off
    client_gone: bool = False
    usage_reader: UsageReader | None = None


async def relay_response(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    style: Dialect,
    extra_headers: CIMultiDict[str],
    on_prepared: Callable[[], None] | None = None,
) -> tuple[web.StreamResponse, RelayResult]:
    """Send the upstream's status, headers and body to the client as each chunk arrives."""
    headers = client_response_headers(upstream.headers)
    headers.extend(extra_headers)
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    content_type = upstream.headers.get("Content-Type", "")
    is_sse = "text/event-stream" in content_type
    reader = UsageReader(content_type, upstream.headers.get("Content-Encoding", ""))
    result = RelayResult(usage_reader=reader)
    tail = b"\n\n"
    try:
        await response.prepare(request)
        if on_prepared is not None:
            on_prepared()
        async for chunk in upstream.content.iter_any():
            await response.write(chunk)
            result.bytes_sent += len(chunk)
            tail = (tail + chunk)[-4:] if len(chunk) < 4 else chunk[-4:]
            reader.feed(chunk)
    except asyncio.CancelledError:  # the client went away and aiohttp cancelled the handler
        result.client_gone = True
        upstream.close()
        raise
    except ConnectionResetError:
        # The client went away while a chunk was being written. Returning the response (not
        # raising) keeps aiohttp from logging the reset as an error with a traceback.
        result.client_gone = True
        upstream.close()
        return response, result
    except (TimeoutError, aiohttp.ClientError) as exc:
        result.interrupted = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        upstream.close()
    if result.interrupted is not None:
        at_event_boundary = tail.endswith(b"\n\n") or tail.endswith(b"\r\n\r\n")
        if is_sse and at_event_boundary:
            message = f"deepmem: the upstream stream broke off ({result.interrupted})"
            try:
                await response.write(sse_error_event(style, message))
            except ConnectionResetError:
                result.client_gone = True
                return response, result
        elif request.transport is not None:
            # A body cut mid-way must reach the client as an error, not as a short success.
            request.transport.close()
            return response, result
    try:
        await response.write_eof()
    except ConnectionResetError:
        result.client_gone = True
    return response, result
