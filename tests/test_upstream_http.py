"""The upstream HTTP/1.1 client (``proxy.upstream_http``) against scripted servers on loopback:
every body framing, the pool's reuse of connections, timeouts, and answers that are not HTTP."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from multidict import CIMultiDict
from yarl import URL

from proxy.upstream_http import (
    UpstreamBrokeOff,
    UpstreamClient,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


@dataclass
class Server:
    """A loopback server that answers each connection with ``script``."""

    script: Script
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.script(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request, head and body (by its Content-Length, or chunked), or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        body = b""
        lowered = head.lower()
        if b"content-length:" in lowered:
            length = int(lowered.split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
        elif b"transfer-encoding: chunked" in lowered:
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                chunk = await reader.readexactly(size + 2)
                body += chunk[:-2]
                if size == 0:
                    break
        self.requests.append(head + body)
        return head + body

    def url(self, path: str = "/v1") -> URL:
        return URL(f"http://127.0.0.1:{self.port}{path}")

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(script: Script) -> Server:
        server = await Server(script).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.stop()


def answering(*answers: bytes, keep_open: bool = True) -> Script:
    """A script that reads a request and writes the next answer, for each answer in turn."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server):
        for answer in answers:
            if await server.read_request(reader) is None:
                return
            writer.write(answer)
            await writer.drain()
        if keep_open:
            await reader.read()  # until the client closes

    return script


async def fetch(
    client: UpstreamClient, method: str = "POST", body: bytes | None = b"{}", path: str = "/v1/x"
) -> tuple[int, CIMultiDict[str], bytes]:
    url = URL(f"http://{client.host_header}{path}")
    async with client.request(method, url, CIMultiDict({"X-Test": "1"}), body) as response:
        data = b"".join([chunk async for chunk in response.chunks()])
        return response.status, CIMultiDict(response.headers), data


@pytest.mark.parametrize(
    ("method", "answer", "body"),
    [
        ("POST", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
        (
            "POST",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"hello 0123456789",
        ),
        ("POST", b"HTTP/1.1 204 No Content\r\n\r\n", b""),
        ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b""),
        (
            "POST",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
            b"ok",
        ),
        ("POST", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),
    ],
)
async def test_answers_of_every_framing_are_read_whole_and_the_connection_reused(
    serve, method: str, answer: bytes, body: bytes
) -> None:
    server = await serve(answering(answer, answer))
    client = UpstreamClient(server.url(), read_timeout=5)
    for _ in range(2):
        status, _, data = await fetch(client, method)
        assert status in (200, 201, 204) and data == body
    assert server.connections == 1
    await client.close()


async def test_an_answer_without_a_length_is_read_until_the_connection_closes(serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
    server = await serve(answering(answer, keep_open=False))
    client = UpstreamClient(server.url(), read_timeout=5)
    assert (await fetch(client))[2] == b"until the end"
    server.script = answering(answer, keep_open=False)
    assert (await fetch(client))[2] == b"until the end"
    assert server.connections == 2  # not reused: its end was the connection's
    await client.close()


async def test_connection_close_is_honoured(serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    server = await serve(answering(answer))
    client = UpstreamClient(server.url(), read_timeout=5)
    for _ in range(3):
        assert (await fetch(client))[2] == b"ok"
    assert server.connections == 3
    await client.close()


async def test_the_request_goes_as_given(serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    server = await serve(answering(answer))
    client = UpstreamClient(URL(f"http://u%40x:p%3Aw@127.0.0.1:{server.port}"), read_timeout=5)
    headers = CIMultiDict([("X-One", "1"), ("x-two", "é"), ("X-One", "again")])
    url = URL(f"http://u%40x:p%3Aw@127.0.0.1:{server.port}/v1/a%2Fb?q=1%202", encoded=True)
    async with client.request("POST", url, headers, b'{"a":1}') as response:
        assert response.status == 200
    sent = server.requests[0]
    head, _, body = sent.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/a%2Fb?q=1%202 HTTP/1.1"
    assert lines[1] == f"Host: 127.0.0.1:{server.port}".encode()
    credentials = base64.b64encode(b"u@x:p:w")
    assert lines[2:] == [
        b"Authorization: Basic " + credentials,
        b"X-One: 1",
        "x-two: é".encode(),
        b"X-One: again",
        b"Content-Length: 7",
    ]
    assert body == b'{"a":1}'
    await client.close()


async def test_a_header_with_a_line_break_is_refused(serve) -> None:
    server = await serve(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
    client = UpstreamClient(server.url(), read_timeout=5)
    headers = CIMultiDict({"X-Evil": "a\r\nX-Injected: 1"})
    with pytest.raises(UpstreamProtocolError):
        async with client.request("POST", server.url("/v1/x"), headers, b""):
            pass
    assert server.requests == []
    await client.close()


async def test_a_streamed_body_goes_chunked_unless_its_length_is_known(serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    server = await serve(answering(answer, answer))
    client = UpstreamClient(server.url(), read_timeout=5)

    class Stream:
        async def iter_any(self) -> AsyncIterator[bytes]:
            for part in (b"one ", b"two"):
                yield part

    async with client.request("POST", server.url("/v1/x"), CIMultiDict(), Stream()) as response:
        assert response.status == 200
    known = CIMultiDict({"Content-Length": "7"})
    async with client.request("POST", server.url("/v1/x"), known, Stream()) as response:
        assert response.status == 200
    first, second = server.requests
    assert b"Transfer-Encoding: chunked" in first and first.endswith(b"one two")
    assert b"Content-Length: 7" in second and b"chunked" not in second
    assert second.endswith(b"one two")
    await client.close()


async def test_chunks_are_handed_on_as_they_arrive(serve) -> None:
    first_seen = asyncio.Event()

    async def script(reader, writer, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.wait_for(first_seen.wait(), 5)
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(script)
    client = UpstreamClient(server.url(), read_timeout=5)
    got = []
    async with client.request("POST", server.url("/v1/x"), CIMultiDict(), b"{}") as response:
        async for chunk in response.chunks():
            got.append(chunk)
            first_seen.set()
    assert got == [b"first", b"second"]
    await client.close()


async def test_a_pooled_connection_closed_by_the_upstream_is_replaced(serve) -> None:
    """The upstream drops an idle connection as the next request is sent on it (it answers
    nothing there): the request goes again on a new connection, and is answered once."""
    answered = 0

    async def script(reader, writer, server: Server) -> None:
        nonlocal answered
        limit = 1 if server.connections == 1 else 2
        for _ in range(limit):
            if await server.read_request(reader) is None:
                return
            answered += 1
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        await server.read_request(reader)  # the next one on the first connection: dropped
        writer.transport.abort()

    server = await serve(script)
    client = UpstreamClient(server.url(), read_timeout=5)
    assert (await fetch(client))[2] == b"ok"
    assert (await fetch(client))[2] == b"ok"
    assert answered == 2 and server.connections == 2
    await client.close()


async def test_an_upstream_that_stays_silent_times_out(serve) -> None:
    async def silent(reader, writer, server: Server) -> None:
        await server.read_request(reader)
        await reader.read()

    server = await serve(silent)
    client = UpstreamClient(server.url(), read_timeout=0.2)
    with pytest.raises(UpstreamTimeout):
        await fetch(client)
    assert isinstance(UpstreamTimeout(), TimeoutError)
    await client.close()


async def test_an_upstream_that_leaves_the_body_unread_times_out(serve) -> None:
    async def deaf(reader, writer, server: Server) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)

    server = await serve(deaf)
    client = UpstreamClient(server.url(), read_timeout=0.3)
    with pytest.raises(UpstreamTimeout, match="read nothing of the request"):
        await fetch(client, body=b"x" * 64_000_000)
    await client.close()


async def test_an_upstream_that_cannot_be_reached_is_reported(unused_tcp_port: int) -> None:
    client = UpstreamClient(URL(f"http://127.0.0.1:{unused_tcp_port}"), connect_timeout=2)
    with pytest.raises(UpstreamUnreachable, match=f"127.0.0.1:{unused_tcp_port}"):
        await fetch(client)
    await client.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Split: a\nSet-Cookie: b\r\nContent-Length: 0\r\n\r\n",
    ],
)
async def test_what_is_not_an_http_answer_is_a_protocol_error(serve, answer: bytes) -> None:
    server = await serve(answering(answer))
    client = UpstreamClient(server.url(), read_timeout=5)
    with pytest.raises(UpstreamProtocolError):
        await fetch(client)
    await client.close()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf", UpstreamBrokeOff),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nhalf", UpstreamBrokeOff),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", UpstreamProtocolError),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nlong\r\n",
            UpstreamProtocolError,
        ),
    ],
)
async def test_a_body_cut_short_or_misframed_breaks_off(serve, answer: bytes, error) -> None:
    server = await serve(answering(answer, keep_open=False))
    client = UpstreamClient(server.url(), read_timeout=5)
    with pytest.raises(error):
        await fetch(client)
    assert issubclass(error, UpstreamError)
    await client.close()


async def test_a_reset_ends_an_answer_without_a_length_as_an_error(serve) -> None:
    async def reset(reader, writer, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\npart of it")
        await writer.drain()
        await asyncio.sleep(0.05)
        linger = struct.pack("ii", 1, 0)  # closed with a reset, not a FIN
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.transport.abort()

    server = await serve(reset)
    client = UpstreamClient(server.url(), read_timeout=5)
    with pytest.raises(UpstreamBrokeOff):
        await fetch(client)
    await client.close()


async def test_an_answer_before_the_whole_body_was_read_is_relayed(serve) -> None:
    """An upstream that refuses a large body from its head (413) and closes: its answer
    reaches the caller, not a connection error."""

    async def refuse(reader, writer, server: Server) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 413 Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!"
        )
        await writer.drain()
        linger = struct.pack("ii", 1, 0)
        writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        writer.transport.abort()

    server = await serve(refuse)
    client = UpstreamClient(server.url(), read_timeout=5)
    status, _, data = await fetch(client, body=b"x" * 8_000_000)
    assert (status, data) == (413, b"too big!")
    await client.close()


async def test_a_full_pool_queues_the_next_request_until_a_connection_is_free(serve) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = await serve(answering(*[answer] * 4))
    client = UpstreamClient(server.url(), pool_size=1, read_timeout=5)
    results = await asyncio.gather(*(fetch(client) for _ in range(4)))
    assert [data for _, _, data in results] == [b"ok"] * 4
    assert server.connections == 1
    await client.close()


async def test_a_large_answer_read_slowly_arrives_whole(serve) -> None:
    """The socket is paused while more than a megabyte waits to be taken."""
    payload = bytes(range(256)) * (5 * 4096)  # 5 MiB
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(payload), payload)
    server = await serve(answering(answer))
    client = UpstreamClient(server.url(), read_timeout=5)
    got = bytearray()
    async with client.request("POST", server.url("/v1/x"), CIMultiDict(), b"{}") as response:
        async for chunk in response.chunks():
            got += chunk
            await asyncio.sleep(0)
    assert bytes(got) == payload
    await client.close()


async def test_https_upstreams_are_verified(tmp_path) -> None:
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(server_context)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    client = UpstreamClient(URL(f"https://127.0.0.1:{port}"), ssl_context=trusting)
    assert (await fetch(client))[2] == b"secret"
    await client.close()
    doubting = UpstreamClient(URL(f"https://127.0.0.1:{port}"))  # the system's authorities
    with pytest.raises(UpstreamUnreachable):
        await fetch(doubting)
    await doubting.close()
    server.close()
