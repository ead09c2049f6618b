"""Request bodies sent with a ``Content-Encoding``.

The server does not inflate request bodies (``create_app`` turns aiohttp's ``auto_decompress``
off), so a relayed body goes upstream exactly as received, compressed bytes, coding and length
together. The proxy's own readers decode here: a gzip or deflate body on a chat route is read
for rewriting (and, if rewritten, forwarded uncompressed without ``Content-Encoding``); any
other coding is not decoded, so such a body is relayed as received.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping

from aiohttp import web

_GZIP = 16 + zlib.MAX_WBITS
_WBITS = {"gzip": _GZIP, "x-gzip": _GZIP, "deflate": zlib.MAX_WBITS}


class UnreadableBody(ValueError):
    """A body labelled gzip or deflate whose bytes are not (corrupt or truncated)."""


def content_coding(headers: Mapping[str, str]) -> str:
    """The body's coding, lower case; ``""`` for none (or ``identity``)."""
    coding = headers.get("Content-Encoding", "").strip().lower()
    return "" if coding == "identity" else coding


def decode_body(wire: bytes, coding: str, limit: int) -> bytes:
    """The body before its ``coding``; ``wire`` itself for a coding deepmem does not decode.

    Raises ``UnreadableBody`` for bytes that are not what the coding says, and aiohttp's
    ``HTTPRequestEntityTooLarge`` when the decoded body would exceed ``limit`` bytes.
    """
    wbits = _WBITS.get(coding)
    if wbits is None or not wire:
        return wire
    if coding == "deflate" and not _zlib_header(wire):
        wbits = -zlib.MAX_WBITS  # raw deflate without the zlib wrapper, as some clients send
    out = bytearray()
    rest = wire
    try:
        while rest:
            inflater = zlib.decompressobj(wbits)
            out += inflater.decompress(rest, limit + 1 - len(out))
            if len(out) > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(out))
            if not inflater.eof:
                raise UnreadableBody(f"the {coding} request body is truncated")
            # gzip allows several members one after another; deflate has one stream
            rest = inflater.unused_data if wbits == _GZIP else b""
    except zlib.error as exc:
        raise UnreadableBody(f"the request body is not valid {coding} data ({exc})") from exc
    return bytes(out)


def _zlib_header(data: bytes) -> bool:
    """RFC 1950: compression method 8, and the first two bytes a multiple of 31."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


async def decoded(wire: bytes, coding: str, limit: int) -> bytes:
    """``decode_body`` off the event loop (inflating up to the body limit takes a while)."""
    if coding not in _WBITS or not wire:
        return wire
    return await asyncio.to_thread(decode_body, wire, coding, limit)


async def read_wire(request: web.Request) -> bytes:
    """The request body's bytes as received, at most ``request.client_max_size`` of them
    (else aiohttp's ``HTTPRequestEntityTooLarge``).

    A body of known length is left to arrive whole and taken in one join: aiohttp's ``read``
    copies it three times (the chunks of each read joined, a growing bytearray, its bytes),
    0.95 against 0.72 ms at p50 for 700 KB on loopback. When more than the reader's first
    limit (128 KB) came before the handler ran, the socket is paused, and only a read resumes
    it: what came is taken first (under uvloop, which reads 256 KB at a time, a 525 KB body
    waited for ever). A body of unknown length (chunked) is read as it comes, so that the
    limit stops it."""
    limit, length = request.client_max_size, request.content_length
    if length is None:
        return await request.read()
    if length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=length)
    content = request.content
    content.set_read_chunk_size(length)  # never pause the socket again before the body is whole
    transport = request.transport
    if transport is not None and not transport.is_reading() and not content.is_eof():
        early = content.read_nowait(-1)  # paused before the handler ran: a read resumes it
        await content.wait_eof()
        return early + content.read_nowait(-1)
    await content.wait_eof()
    return content.read_nowait(-1)


async def read_body(request: web.Request) -> bytes:
    """The whole request body, decoded, for the proxy's own endpoints."""
    wire = await read_wire(request)
    return await decoded(wire, content_coding(request.headers), request.client_max_size)
