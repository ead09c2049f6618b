"""The proxy on real loopback sockets against a scriptable fake upstream."""

from __future__ import annotations

import asyncio
import gzip
import hashlib

import aiohttp
import orjson
import pytest
from aiohttp import web
from yarl import URL

from tests.addons import Hook
from tests.fake_upstream import (
    anthropic_stream,
    chat_stream,
    json_answer,
    responses_stream,
    sse,
    stream_frames,
)

DIALECT_CALLS = [
    (
        "/v1/chat/completions",
        chat_stream,
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "/anthropic/messages",
        anthropic_stream,
        {"model": "c", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "/openai/responses",
        responses_stream,
        {"model": "g", "input": [{"role": "user", "content": "hi"}]},
    ),
]


def _body(payload: dict[str, object], stream: bool) -> bytes:
    return orjson.dumps({**payload, "stream": stream})


async def _chat(client, proxy, session: str, stream: bool) -> tuple[int, bytes]:
    """A chat request of its own session through the proxy: the status and the body read."""
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=_body(DIALECT_CALLS[0][2], stream=stream),
        headers={"x-session-id": session},
    ) as response:
        return response.status, await response.read()


@pytest.mark.parametrize(("path", "frames", "payload"), DIALECT_CALLS)
async def test_non_stream_relayed_unchanged(proxy, upstream, client, path, frames, payload):
    body = _body(payload, stream=False)
    async with client.post(
        proxy.url + path,
        data=body,
        headers={"x-session-id": "ses_a", "Content-Type": "application/json"},
    ) as response:
        assert response.status == 200
        answer = await response.read()
        assert response.headers["Server-Timing"].startswith("deepmem;dur=")
    assert orjson.loads(answer) == json_answer(path, "hello from upstream for ses_a")
    [seen] = upstream.requests
    assert seen.body == body
    assert seen.path == "/v1/" + path.split("/", 2)[2]  # the prefix maps to the upstream's /v1
    stats = proxy.state.sessions.get("ses_a")
    assert stats is not None and stats.tally.requests == 1
    assert stats.last_usage is not None and stats.last_usage.input_tokens == 40


@pytest.mark.parametrize(("path", "frames", "payload"), DIALECT_CALLS)
async def test_stream_relayed_byte_for_byte_and_usage_read(
    proxy, upstream, client, path, frames, payload
):
    async with client.post(
        proxy.url + path, data=_body(payload, stream=True), headers={"x-session-id": "ses_s"}
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        received = await response.read()
    assert received == b"".join(frames("hello from upstream for ses_s"))
    session = proxy.state.sessions.get("ses_s")
    assert session is not None and session.tally.streams == 1
    assert session.last_usage is not None
    assert session.last_usage.input_tokens == 100
    assert session.last_usage.output_tokens == 7
    assert session.last_usage.cache_read_tokens > 0


async def test_first_chunk_reaches_client_before_upstream_sends_second(proxy, upstream, client):
    release = asyncio.Event()

    async def gated(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        await asyncio.wait_for(release.wait(), timeout=10)
        await response.write(b'data: {"n": 2}\n\n')
        return response

    upstream.handler = gated
    body = _body(DIALECT_CALLS[0][2], stream=True)
    async with client.post(proxy.url + "/v1/chat/completions", data=body) as response:
        first = await asyncio.wait_for(response.content.readany(), timeout=5)
        assert first == b'data: {"n": 1}\n\n'
        assert not release.is_set()
        release.set()
        rest = await response.read()
    assert rest == b'data: {"n": 2}\n\n'


async def test_headers_forwarded_byte_for_byte_and_hop_by_hop_dropped(proxy, upstream, client):
    sent = {
        "Authorization": "Bearer sk-test-0123456789",
        "x-api-key": "sk-ant-test-0123456789",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
        "OpenAI-Organization": "org-Abc",
        "OpenAI-Project": "proj_Xyz",
        "x-Custom-Thing": "Keep  This  Exactly",
        "User-Agent": "opencode/1.18.33 ai-sdk/provider-utils/4.0.46 runtime/bun/1.3.14",
        "Accept-Encoding": "gzip, deflate, br, zstd",
        "Proxy-Authorization": "Basic c2VjcmV0",
        "TE": "trailers",
        "Keep-Alive": "timeout=5",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "only-for-the-proxy",
    }
    body = _body(DIALECT_CALLS[1][2], stream=False)
    async with client.post(proxy.url + "/anthropic/messages", data=body, headers=sent) as response:
        assert response.status == 200
        await response.read()
    [seen] = upstream.requests
    for name in (
        "Authorization",
        "x-api-key",
        "anthropic-version",
        "anthropic-beta",
        "OpenAI-Organization",
        "OpenAI-Project",
        "x-Custom-Thing",
        "User-Agent",
        "Accept-Encoding",
    ):
        assert seen.header(name) == sent[name], name
        assert name in [key for key, _ in seen.raw_headers], f"{name} lost its spelling"
    for hop in ("Proxy-Authorization", "TE", "Keep-Alive", "X-Hop"):
        assert seen.header(hop) is None, hop
    assert seen.header("Host") == f"127.0.0.1:{upstream.port}"
    assert seen.header("Content-Length") == str(len(body))


async def test_response_headers_relayed_and_timing_added(proxy, upstream, client):
    async def with_headers(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.json_response({"ok": True}, status=200)
        response.headers["x-request-id"] = "req_123"
        response.headers["anthropic-ratelimit-requests-remaining"] = "42"
        response.headers.add("Set-Cookie", "a=1")
        response.headers.add("Set-Cookie", "b=2")
        return response

    upstream.handler = with_headers
    async with client.get(proxy.url + "/v1/models") as response:
        assert response.headers["x-request-id"] == "req_123"
        assert response.headers["anthropic-ratelimit-requests-remaining"] == "42"
        assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert "deepmem;dur=" in response.headers["Server-Timing"]
        assert await response.json() == {"ok": True}


async def test_upstream_cookies_are_never_kept_nor_sent_with_other_requests(start_proxy, upstream):
    """The proxy relays ``Set-Cookie`` to the client that got it, and keeps no cookie jar of
    its own: one client's cookies (a provider's load-balancer or bot-check cookies) must not
    go upstream with another's requests. The upstream is named ``localhost``: a client jar
    keeps cookies of a host name, not of a bare IP address."""

    async def sets_cookie(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.json_response({"ok": True})
        response.headers.add("Set-Cookie", "affinity=client-a; Path=/")
        return response

    upstream.handler = sets_cookie
    port = URL(upstream.url).port
    proxy = await start_proxy(upstream=[f"http://localhost:{port}/v1"])
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as first,
        first.get(proxy.url + "/v1/models") as response,
    ):
        assert response.headers.getall("Set-Cookie") == ["affinity=client-a; Path=/"]
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as second:
        async with second.get(proxy.url + "/v1/models") as response:
            assert response.status == 200
        async with second.get(proxy.url + "/v1/models", headers={"Cookie": "own=b"}) as response:
            assert response.status == 200
    assert [seen.headers_named("Cookie") for seen in upstream.requests] == [[], [], ["own=b"]]


@pytest.mark.parametrize("status", [400, 401, 429, 500, 529])
async def test_upstream_errors_relayed_as_they_are(proxy, upstream, client, status):
    error = orjson.dumps({"error": {"message": f"upstream says {status}", "type": "x"}})

    async def failing(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(
            body=error,
            status=status,
            content_type="application/json",
            headers={"retry-after": "7", "x-request-id": "req_err"},
        )

    upstream.handler = failing
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=_body(DIALECT_CALLS[0][2], stream=True),
        headers={"x-session-id": "ses_err"},
    ) as response:
        assert response.status == status
        assert response.headers["retry-after"] == "7"
        assert response.headers["x-request-id"] == "req_err"
        assert await response.read() == error
    assert proxy.state.sessions.get("ses_err").tally.errors == 1


async def test_redirects_are_relayed_not_followed(proxy, upstream, client):
    async def redirect(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": "/elsewhere"})

    upstream.handler = redirect
    async with client.get(proxy.url + "/v1/models", allow_redirects=False) as response:
        assert response.status == 307
        assert response.headers["Location"] == "/elsewhere"
    assert len(upstream.requests) == 1


async def test_compressed_response_relayed_compressed(proxy, upstream, client):
    payload = orjson.dumps(json_answer("/v1/chat/completions", "zipped"))
    packed = gzip.compress(payload)

    async def zipped(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(
            body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    upstream.handler = zipped
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=_body(DIALECT_CALLS[0][2], stream=False),
        headers={"x-session-id": "ses_gz"},
    ) as response:
        assert response.headers["Content-Encoding"] == "gzip"
        assert await response.read() == packed
    usage = proxy.state.sessions.get("ses_gz").last_usage
    assert usage is not None and usage.input_tokens == 40


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/chat/completions", "openai"),
        ("/anthropic/messages", "anthropic"),
        ("/openai/responses", "openai"),
        ("/v1/models", "openai"),
    ],
)
async def test_upstream_down_gives_502_in_dialect_shape(
    start_proxy, client, unused_tcp_port, path, shape
):
    proxy = await start_proxy(
        upstream=[
            f"http://127.0.0.1:{unused_tcp_port}/v1",
            f"anthropic=http://127.0.0.1:{unused_tcp_port}/v1",
            f"openai=http://127.0.0.1:{unused_tcp_port}/v1",
        ]
    )
    method = "GET" if path.endswith("models") else "POST"
    async with client.request(method, proxy.url + path, data=b'{"messages": []}') as response:
        assert response.status == 502
        error = await response.json()
    if shape == "anthropic":
        assert error["type"] == "error"
        assert error["error"]["type"] == "upstream_unreachable"
        message = error["error"]["message"]
    else:
        assert error["error"]["code"] == "upstream_unreachable"
        message = error["error"]["message"]
    assert f"127.0.0.1:{unused_tcp_port}" in message
    assert proxy.state.metrics.counter_total("deepmem_upstream_errors_total") == 1


async def test_upstream_silent_gives_504(start_proxy, upstream, client):
    async def silent(request: web.Request, body: bytes) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response()

    upstream.handler = silent
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], read_timeout="0.3")
    async with client.post(
        proxy.url + "/v1/chat/completions", data=_body(DIALECT_CALLS[0][2], stream=True)
    ) as response:
        assert response.status == 504
        error = await response.json()
    assert error["error"]["code"] == "upstream_timeout"


async def test_upstream_dying_mid_stream_ends_client_stream_cleanly(proxy, upstream, client):
    frames = chat_stream("one two three")

    async def dying(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(frames[0])
        await response.write(frames[1])
        await asyncio.sleep(0.05)
        request.transport.close()  # the provider's process dies
        return response

    upstream.handler = dying
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=_body(DIALECT_CALLS[0][2], stream=True),
        headers={"x-session-id": "ses_die"},
    ) as response:
        assert response.status == 200
        received = await asyncio.wait_for(response.read(), timeout=5)
    assert received.startswith(frames[0] + frames[1])
    tail = received[len(frames[0] + frames[1]) :]
    assert tail.startswith(b"data: ") and tail.endswith(b"\n\n")
    event = orjson.loads(tail[len(b"data: ") :])
    assert event["error"]["code"] == "upstream_stream_interrupted"
    metrics = proxy.state.metrics.counters["deepmem_upstream_errors_total"]
    assert sum(metrics.values()) == 1
    assert proxy.state.sessions.get("ses_die").tally.errors == 1


async def test_upstream_dying_mid_json_body_is_an_error_for_the_client(proxy, upstream, client):
    async def truncated(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "application/json", "Content-Length": "1000"}
        )
        await response.prepare(request)
        await response.write(b'{"id": "c1", "choi')
        await asyncio.sleep(0.05)
        request.transport.close()
        return response

    upstream.handler = truncated
    with pytest.raises(aiohttp.ClientPayloadError):
        async with client.post(
            proxy.url + "/v1/chat/completions", data=_body(DIALECT_CALLS[0][2], stream=False)
        ) as response:
            await asyncio.wait_for(response.read(), timeout=5)


async def test_client_abort_cancels_upstream_at_once(proxy, upstream, client):
    upstream_gone = asyncio.Event()

    async def endless(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"n": 1}\n\n')
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            upstream_gone.set()
            raise
        return response

    upstream.handler = endless
    response = await client.post(
        proxy.url + "/v1/chat/completions", data=_body(DIALECT_CALLS[0][2], stream=True)
    )
    assert await response.content.readany() == b'data: {"n": 1}\n\n'
    response.close()  # the user pressed Esc in OpenCode
    await asyncio.wait_for(upstream_gone.wait(), timeout=3)
    for _ in range(50):
        if proxy.state.metrics.counter_total("deepmem_client_disconnects_total"):
            break
        await asyncio.sleep(0.02)
    assert proxy.state.metrics.counter_total("deepmem_client_disconnects_total") == 1
    assert sum(proxy.state.metrics.gauges["deepmem_active_streams"].values()) == 0


async def test_twenty_megabyte_body_arrives_intact(proxy, upstream, client):
    big_text = ("0123456789abcdef" * 64 + "\n") * 19_500
    body = orjson.dumps(
        {"model": "m", "stream": False, "messages": [{"role": "user", "content": big_text}]}
    )
    assert len(body) > 20_000_000
    async with client.post(proxy.url + "/v1/chat/completions", data=body) as response:
        assert response.status == 200
        await response.read()
    [seen] = upstream.requests
    assert hashlib.sha256(seen.body).digest() == hashlib.sha256(body).digest()


async def test_body_over_limit_gets_413_in_dialect_shape(start_proxy, upstream, client):
    proxy = await start_proxy(upstream=[f"anthropic={upstream.url}/v1"], max_body_mb="1")
    body = b'{"messages": [], "x": "' + b"a" * 1_200_000 + b'"}'
    async with client.post(proxy.url + "/anthropic/messages", data=body) as response:
        assert response.status == 413
        error = await response.json()
    assert error["type"] == "error" and error["error"]["type"] == "request_too_large"
    assert "1 MiB" in error["error"]["message"]
    assert upstream.requests == []


async def test_fifty_concurrent_streams_do_not_cross(proxy, upstream, client):
    upstream.chunk_delay = 0.005

    async def one(index: int) -> bytes:
        return (await _chat(client, proxy, f"ses_{index:02d}", stream=True))[1]

    results = await asyncio.gather(*(one(i) for i in range(50)))
    for index, received in enumerate(results):
        assert received == b"".join(chat_stream(f"hello from upstream for ses_{index:02d}"))
    totals = proxy.state.sessions.snapshot()["totals"]
    assert totals["sessions"] == 50 and totals["streams"] == 50
    for index in range(50):
        session = proxy.state.sessions.get(f"ses_{index:02d}")
        assert session.tally.requests == 1 and session.last_usage.input_tokens == 100


async def test_non_json_chat_body_relayed_untouched_and_counted(proxy, upstream, client):
    async with client.post(proxy.url + "/v1/chat/completions", data=b"not json {") as response:
        assert response.status == 400  # the provider answers it
    assert upstream.requests[0].body == b"not json {"
    assert proxy.state.metrics.counter_total("deepmem_non_json_bodies_total") == 1


async def test_other_paths_relayed_untouched(proxy, upstream, client):
    url = URL(proxy.url + "/v1/models?limit=5&after=a%2Fb", encoded=True)
    async with client.get(url) as response:
        assert response.status == 200
    count_body = b'{"model":"c","messages":[{"role":"user","content":"hi"}]}'
    async with client.post(
        proxy.url + "/anthropic/messages/count_tokens",
        data=count_body,
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status == 200
    models, count = upstream.requests
    assert (models.method, models.path, models.query_string) == (
        "GET",
        "/v1/models",
        "limit=5&after=a%2Fb",
    )
    assert count.path == "/v1/messages/count_tokens" and count.body == count_body
    assert count.header("Content-Length") == str(len(count_body))


async def test_unknown_prefix_is_a_clear_404(proxy, client):
    async with client.post(proxy.url + "/nope/chat/completions", data=b"{}") as response:
        assert response.status == 404
        error = await response.json()
    assert "no upstream is served at /nope/" in error["error"]["message"]


async def test_transform_failure_forwards_original_bytes(start_proxy, upstream, client):
    def broken(conversation, context):
        conversation.set_text(conversation.items[0], "half-edited")
        raise RuntimeError("bug in a compressor")

    proxy = await start_proxy([Hook(broken)], upstream=[f"{upstream.url}/v1"])
    body = b'{"model":"m", "messages":[{"role":"user","content":"keep me"}],  "stream":false}'
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": "ses_fo"}
    ) as response:
        assert response.status == 200
    assert upstream.requests[0].body == body
    assert proxy.state.metrics.counter_total("deepmem_fail_open_total") == 1
    assert proxy.state.sessions.get("ses_fo").tally.fail_opens == 1


async def test_transform_edit_is_forwarded_with_right_length(start_proxy, upstream, client):
    def shout(conversation, context):
        for item in conversation.items:
            conversation.set_text(item, item.text.upper())
        return True

    proxy = await start_proxy([Hook(shout)], upstream=[f"{upstream.url}/v1"])
    body = b'{"model":"m","messages":[{"role":"user","content":"quiet \\u00e9"}],"stream":false}'
    async with client.post(proxy.url + "/v1/chat/completions", data=body) as response:
        assert response.status == 200
    [seen] = upstream.requests
    assert orjson.loads(seen.body)["messages"][0]["content"] == "QUIET É"
    assert seen.header("Content-Length") == str(len(seen.body))


async def test_upstream_sse_with_crlf_and_split_lines_still_yields_usage(proxy, upstream, client):
    payload = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 321, "completion_tokens": 4}})
    whole = b"data: " + payload + b"\r\n\r\ndata: [DONE]\r\n\r\n"

    async def split(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(0, len(whole), 7):
            await response.write(whole[index : index + 7])
            await asyncio.sleep(0)
        return response

    upstream.handler = split
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=_body(DIALECT_CALLS[0][2], stream=True),
        headers={"x-session-id": "ses_split"},
    ) as response:
        assert await response.read() == whole
    assert proxy.state.sessions.get("ses_split").last_usage.input_tokens == 321


async def test_anthropic_error_event_mid_stream_is_relayed(proxy, upstream, client):
    frames = sse(
        [{"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}], ["error"]
    )

    async def overloaded(request: web.Request, body: bytes) -> web.StreamResponse:
        return await stream_frames(request, frames)

    upstream.handler = overloaded
    async with client.post(
        proxy.url + "/anthropic/messages", data=_body(DIALECT_CALLS[1][2], stream=True)
    ) as response:
        assert await response.read() == b"".join(frames)


async def test_client_abort_before_upstream_answers_cancels_upstream(proxy, upstream, client):
    upstream_gone = asyncio.Event()
    started = asyncio.Event()

    async def thinking(request: web.Request, body: bytes) -> web.StreamResponse:
        started.set()
        try:
            await asyncio.sleep(60)  # a long non-streamed generation
        except asyncio.CancelledError:
            upstream_gone.set()
            raise
        return web.Response()

    upstream.handler = thinking
    task = asyncio.ensure_future(
        client.post(proxy.url + "/v1/chat/completions", data=_body(DIALECT_CALLS[0][2], False))
    )
    await asyncio.wait_for(started.wait(), timeout=3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(upstream_gone.wait(), timeout=3)


async def test_more_streams_than_the_pool_all_succeed(start_proxy, upstream, client):
    """A full connection pool queues a request; the wait for a slot is not a connect
    timeout (it used to answer 504 'Connection timeout' with the upstream healthy)."""
    frames = chat_stream("one two three four five six")

    async def slow(request: web.Request, body: bytes) -> web.StreamResponse:
        return await stream_frames(request, frames, delay=0.1)

    upstream.handler = slow
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"], upstream_pool_size="3", connect_timeout="0.2"
    )

    results = await asyncio.gather(
        *(_chat(client, proxy, f"ses_pool_{n}", stream=True) for n in range(5))
    )
    assert [status for status, _ in results] == [200] * 5
    assert all(body == b"".join(frames) for _, body in results)
    assert proxy.state.metrics.counter_total("deepmem_upstream_errors_total") == 0


async def test_default_pool_has_no_limit(proxy, upstream, client):
    """A proxy must not serialise a user's streams: by default the pool is unbounded. The
    upstream answers none of 12 requests before all 12 have reached it."""
    arrived = 0
    everyone = asyncio.Event()

    async def together(request: web.Request, body: bytes) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        if arrived == 12:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), timeout=5)
        return web.json_response({"ok": True})

    upstream.handler = together

    answers = await asyncio.gather(
        *(_chat(client, proxy, f"ses_open_{n}", stream=False) for n in range(12))
    )
    assert [status for status, _ in answers] == [200] * 12
