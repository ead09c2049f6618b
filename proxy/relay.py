"""The upstream side: pooled clients, header hygiene and the chunk-by-chunk relay."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from compressors.view import Dialect
from compressors.wire import sse_error_event
from proxy.config import Settings
from proxy.opt_out import OPT_OUT_HEADER
from proxy.upstream_http import UpstreamClient, UpstreamError, UpstreamResponse
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
    """One ``UpstreamClient`` (its keep-alive connections) per upstream, made on start-up,
    closed on shutdown."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._clients: dict[str, UpstreamClient] = {}

    async def start(self) -> None:
        for upstream in self.settings.upstreams:
            self._clients[upstream.name] = UpstreamClient(
                URL(upstream.url),
                pool_size=self.settings.upstream_pool_size,  # 0: no limit
                connect_timeout=self.settings.connect_timeout,
                read_timeout=self.settings.read_timeout,
            )

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()

    def client(self, name: str) -> UpstreamClient:
        return self._clients[name]


@dataclass(slots=True)
class RelayResult:
    bytes_sent: int = 0
    interrupted: str | None = None  # why the upstream body broke off
    client_gone: bool = False
    usage_reader: UsageReader | None = None


async def relay_response(
    request: web.Request,
    upstream: UpstreamResponse,
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
        async for chunk in upstream.chunks():
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
    except UpstreamError as exc:
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
