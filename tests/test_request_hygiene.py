"""Request hygiene: bodies the proxy must forward exactly, or answer clearly (issue 10).

Numbers beyond 64 bits, bodies of a shape deepmem does not understand, compressed bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gzip
import json
import logging
import re
import tempfile
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDictProxy

from compressors.view import Conversation, Dialect
from proxy.addons import build_addons
from proxy.config import load_settings
from proxy.flow import Addon, Flow
from proxy.pipeline import Outcome, rewrite_request
from proxy.request_body import read_wire
from proxy.stores import open_stores
from tests.addons import Hook
from tests.conftest import ProxyFactory, RunningProxy
from tests.fake_upstream import FakeUpstream
from tests.strategies import render, sessions, with_cache_marks

HEADERS = {"x-session-id": "hygiene"}


def _mark_first_item(conversation: Conversation, flow: Flow) -> bool:
    """A transform that always changes the body, so the proxy re-serialises it."""
    if not conversation.items:
        return False
    conversation.set_text(conversation.items[0], "rewritten")
    return True


mark_first_item = Hook(_mark_first_item)


# --- item 17: integers outside 64 bits keep their exact text -------------------------------

# orjson reads integers from -2**63 to 2**64-1 exactly, anything beyond as a float.
OUTSIDE_64_BITS = st.integers(max_value=-(2**63) - 1) | st.integers(min_value=2**64)


@settings(max_examples=200, deadline=None)
@given(
    top=OUTSIDE_64_BITS,
    in_message=OUTSIDE_64_BITS,
    in_list=st.lists(OUTSIDE_64_BITS | st.integers(), min_size=1, max_size=4),
    spaced=st.booleans(),
)
@example(top=-(2**63) - 1, in_message=2**64, in_list=[-9223372036854775809], spaced=False)
def test_rewritten_body_keeps_the_exact_text_of_integers_beyond_64_bits(
    top: int, in_message: int, in_list: list[int], spaced: bool
) -> None:
    body = {
        "model": "m",
        "seed": top,
        "messages": [
            {"role": "user", "content": "hello", "x_trace": in_message},
            {"role": "assistant", "content": "hi", "x_numbers": in_list},
        ],
    }
    separators = (", ", ": ") if spaced else (",", ":")
    raw = json.dumps(body, separators=separators).encode()
    rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, HEADERS, [mark_first_item])
    assert rewrite.outcome == Outcome.REWRITTEN
    tokens = re.findall(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", rewrite.body)
    for number in (top, in_message, *in_list):
        assert str(number).encode() in tokens
    forwarded = json.loads(rewrite.body)
    assert forwarded["seed"] == top and isinstance(forwarded["seed"], int)
    assert forwarded["messages"][0]["x_trace"] == in_message
    assert forwarded["messages"][1]["x_numbers"] == in_list
    assert forwarded["messages"][0]["content"] == "rewritten"


# --- item 16: bodies of a shape deepmem does not read are relayed quietly -------------------


@contextlib.contextmanager
def deepmem_records() -> Iterator[list[logging.LogRecord]]:
    """Every record the deepmem loggers emit meanwhile (a hypothesis test cannot use caplog)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("deepmem")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def real_transforms() -> Iterator[list[Addon]]:
    with tempfile.TemporaryDirectory() as data_dir:
        proxy_settings = load_settings({"data_dir": data_dir}, environ={})
        yield build_addons(proxy_settings, open_stores(proxy_settings, in_memory=True))


def _chat(*messages: object, **extra: object) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


USER = {"role": "user", "content": "hello"}
WRONG_SHAPES: list[tuple[Dialect, dict[str, Any]]] = [
    (Dialect.OPENAI_CHAT, _chat(USER, {"role": "assistant", "content": "x", "tool_calls": 5})),
    (Dialect.OPENAI_CHAT, _chat(USER, tools=5)),
    (Dialect.OPENAI_CHAT, _chat(USER, {"role": "user", "content": {"text": "x"}})),
    (Dialect.OPENAI_CHAT, _chat(USER, "not a message")),
    (Dialect.OPENAI_CHAT, _chat({"role": ["user"], "content": "x"})),
    (Dialect.ANTHROPIC, _chat({"role": "user"})),
    (Dialect.ANTHROPIC, _chat({"role": "user", "content": [{"type": {"x": 1}, "text": "t"}]})),
    (Dialect.ANTHROPIC, _chat({"role": "user", "content": [{"type": ["text"]}]})),
    (Dialect.ANTHROPIC, _chat(USER, system={"text": "s"})),
    (Dialect.OPENAI_RESPONSES, {"input": [{"type": "message", "role": "user"}]}),
    (Dialect.OPENAI_RESPONSES, {"input": [{"type": "reasoning"}]}),
    (Dialect.OPENAI_RESPONSES, {"input": [{"role": "user", "content": 3}], "tools": {}}),
]


@pytest.mark.parametrize(("dialect", "body"), WRONG_SHAPES)
def test_body_of_a_shape_deepmem_does_not_read_is_relayed_without_an_error_log(
    real_transforms: list[Addon], dialect: Dialect, body: dict[str, Any]
) -> None:
    """Were fail-opens logged at ERROR with a traceback (KeyError, TypeError in the view)."""
    raw = json.dumps(body).encode()
    with deepmem_records() as records:
        rewrite = rewrite_request(raw, dialect, HEADERS, real_transforms)
    assert rewrite.outcome == Outcome.NOT_CHAT and rewrite.body is raw
    assert [r.levelno for r in records] == [logging.INFO]
    assert records[0].exc_info is None and "relayed unchanged" in records[0].getMessage()


WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just({"type": {"nested": True}}),
    st.just([{"type": ["text"]}]),
)
DELETE = object()
STRUCTURAL_KEYS = {"messages", "input", "content", "role", "type", "tool_calls", "tools", "system"}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict | list):
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            yield from _paths(child, (*path, key))


@st.composite
def wrong_shaped_bodies(draw: st.DrawFn) -> tuple[Dialect, bytes]:
    """A real-looking request with values replaced, or keys (such as ``content``) removed."""
    rendered = render(draw(sessions(max_turns=2)), draw(st.sampled_from(list(Dialect))))
    body: Any = rendered.request(rendered.boundaries[-1])
    for _ in range(draw(st.integers(1, 3))):
        paths = [path for path in _paths(body) if path]
        structural = [path for path in paths if path[-1] in STRUCTURAL_KEYS]
        path = draw(st.sampled_from(structural or paths) | st.sampled_from(paths))
        holder = body
        for part in path[:-1]:
            holder = holder[part]
        value = draw(st.just(DELETE) | WRONG_VALUES)
        if value is DELETE and isinstance(holder, dict):
            del holder[path[-1]]
        elif value is not DELETE:
            holder[path[-1]] = copy.deepcopy(value)
    return rendered.dialect, json.dumps(body).encode()


def test_a_cache_mark_edited_in_one_request_is_not_in_the_next() -> None:
    """``wrong_shaped_bodies`` edits the values of a rendered request, cache marks among them:
    they were one shared module-level dict, so an edit changed every later rendering (and
    Hypothesis failed the strategy as flaky, drawing differently on the same choices)."""
    marked = with_cache_marks({"messages": [{"role": "user", "content": "a"}]}, "messages", 1)
    marked["messages"][0]["cache_control"]["type"] = 5
    again = with_cache_marks({"messages": [{"role": "user", "content": "a"}]}, "messages", 1)
    assert again["messages"][0]["cache_control"] == {"type": "ephemeral"}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(wrong_shaped_bodies())
def test_wrong_shaped_bodies_never_fail_open_nor_log_errors(
    real_transforms: list[Addon], case: tuple[Dialect, bytes]
) -> None:
    dialect, raw = case
    with deepmem_records() as records:
        rewrite = rewrite_request(raw, dialect, HEADERS, real_transforms)
    assert rewrite.outcome != Outcome.FAILED_OPEN, rewrite.error
    assert not [r for r in records if r.levelno >= logging.WARNING or r.exc_info]
    if rewrite.outcome != Outcome.REWRITTEN:
        assert rewrite.body is raw


async def test_unrecognised_body_through_the_proxy_is_relayed_and_counted(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = json.dumps(_chat(USER, {"role": "assistant", "tool_calls": 5})).encode()
    caplog.set_level(logging.INFO, logger="deepmem")
    async with client.post(
        f"{proxy.url}/v1/chat/completions",
        data=raw,
        headers={"Content-Type": "application/json", "x-session-id": "odd"},
    ) as response:
        assert response.status == 200
    assert upstream.requests[-1].body == raw
    metrics = proxy.state.metrics
    assert metrics.counter_total("deepmem_unrecognised_bodies_total") == 1
    assert metrics.counter_total("deepmem_fail_open_total") == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


async def test_client_leaving_mid_stream_logs_no_traceback(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was 'Error handling request' with a ConnectionResetError traceback from aiohttp."""

    async def firehose(request: web.Request, body: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for n in range(20_000):
                await response.write(b'data: {"n": %d, "pad": "%s"}\n\n' % (n, b"x" * 2000))
        return response

    upstream.handler = firehose
    caplog.set_level(logging.DEBUG)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    )
    body = json.dumps(_chat(USER, stream=True)).encode()
    port = int(proxy.url.rsplit(":", 1)[1])
    for half_close in (True, False) * 3:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request % (len(body), body))
        await reader.readuntil(b"data: ")
        if half_close:
            writer.write_eof()  # the proxy's next write meets a closing transport
        else:
            writer.transport.abort()  # a reset, as when OpenCode is killed
        await asyncio.sleep(0.2)
        writer.close()
    disconnects = proxy.state.metrics.counter_total("deepmem_client_disconnects_total")
    assert disconnects == 6
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]


# --- item 15: compressed request bodies -----------------------------------------------------


@dataclass
class RawUpstream:
    """An upstream that records each request body exactly as it arrived, still compressed."""

    url: str = ""
    seen: list[tuple[CIMultiDictProxy[str], bytes]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.headers, await request.read()))
        return web.json_response({"id": "c1", "choices": []})


@pytest.fixture
async def raw_upstream() -> AsyncIterator[RawUpstream]:
    recorder = RawUpstream()
    app = web.Application(handler_args={"auto_decompress": False})
    app.router.add_route("*", "/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recorder.url = f"http://127.0.0.1:{port}"
    yield recorder
    await runner.cleanup()


def raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


CODINGS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "deflate ": raw_deflate,  # the same coding without the zlib wrapper, as some clients send
}
CHAT = json.dumps(_chat({"role": "user", "content": "compress me"})).encode()


async def post(
    client: aiohttp.ClientSession, url: str, wire: bytes, coding: str
) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", "Content-Encoding": coding}
    async with client.post(url, data=wire, headers=headers) as response:
        return response.status, await response.read()


@pytest.mark.parametrize("coding", CODINGS)
async def test_rewritten_compressed_body_goes_upstream_decoded_and_relabelled(
    start_proxy: ProxyFactory,
    raw_upstream: RawUpstream,
    client: aiohttp.ClientSession,
    coding: str,
) -> None:
    """Was forwarded decoded but still labelled 'Content-Encoding: gzip'."""
    proxy = await start_proxy([mark_first_item], upstream=[f"{raw_upstream.url}/v1"])
    status, _ = await post(
        client, f"{proxy.url}/v1/chat/completions", CODINGS[coding](CHAT), coding
    )
    assert status == 200
    [(headers, body)] = raw_upstream.seen
    assert json.loads(body)["messages"][0]["content"] == "rewritten"
    assert "Content-Encoding" not in headers
    assert headers["Content-Length"] == str(len(body))


@pytest.mark.parametrize("coding", [*CODINGS, "br", "zstd", "gzip, gzip"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings", "/v1/files"])
async def test_body_not_rewritten_goes_upstream_exactly_as_received(
    start_proxy: ProxyFactory,
    raw_upstream: RawUpstream,
    client: aiohttp.ClientSession,
    coding: str,
    path: str,
) -> None:
    """Relay routes kept the compressed Content-Length beside the inflated body (truncated
    upstream); br and zstd got a plain-text 400 from the server before the handler."""
    proxy = await start_proxy([], upstream=[f"{raw_upstream.url}/v1"])
    wire = CODINGS.get(coding, lambda data: b"\x28\xb5\x2f\xfd opaque " + data)(CHAT)
    status, _ = await post(client, proxy.url + path, wire, coding)
    assert status == 200
    [(headers, body)] = raw_upstream.seen
    assert body == wire
    assert headers["Content-Encoding"] == coding.strip()
    assert headers["Content-Length"] == str(len(wire))


@pytest.mark.parametrize(
    ("coding", "wire"),
    [
        ("gzip", b"definitely not gzip"),
        ("gzip", gzip.compress(CHAT)[:-12]),  # truncated
        ("deflate", b"\x78\x9c" + b"\xff" * 20),
        ("gzip", gzip.compress(CHAT) + b"trailing junk"),
    ],
)
@pytest.mark.parametrize("route", ["/openai/chat/completions", "/anthropic/messages"])
async def test_corrupt_compressed_body_is_a_400_in_the_provider_shape(
    proxy: RunningProxy,
    upstream: FakeUpstream,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    coding: str,
    wire: bytes,
    route: str,
) -> None:
    """Was a bare 500 with a traceback."""
    status, answer = await post(client, proxy.url + route, wire, coding)
    assert status == 400
    error = json.loads(answer)
    if route.startswith("/anthropic"):
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        message = error["error"]["message"]
    else:
        assert error["error"]["code"] == "bad_encoding"
        message = error["error"]["message"]
    assert message.startswith("deepmem: the ") and coding in message
    assert upstream.requests == []
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_compressed_body_inflating_beyond_the_limit_is_a_413(
    start_proxy: ProxyFactory, raw_upstream: RawUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy([], upstream=[f"{raw_upstream.url}/v1"], max_body_mb="1")
    bomb = gzip.compress(b'{"messages": [], "x": "' + b"a" * 3_000_000 + b'"}')
    assert len(bomb) < 100_000
    status, answer = await post(client, f"{proxy.url}/v1/chat/completions", bomb, "gzip")
    assert status == 413 and b"1 MiB" in answer
    assert raw_upstream.seen == []


def test_tool_call_arguments_with_a_huge_integer_are_read_not_failed_open(
    real_transforms: list[Addon],
) -> None:
    """Was a fail-open with an ERROR traceback: orjson cannot serialise the exactly-parsed
    integer when the view renders the arguments object as text."""
    log = "\n".join(
        f"line {n}: worker processed item {n} in module pkg.sub_{n % 7}" for n in range(3000)
    )
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "run it"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "bash", "input": {"n": 2**80}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": log}],
            },
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "next"},
        ],
    }
    raw = json.dumps(body).encode()
    with deepmem_records() as records:
        rewrite = rewrite_request(raw, Dialect.ANTHROPIC, HEADERS, real_transforms)
    assert rewrite.outcome in (Outcome.REWRITTEN, Outcome.FORWARDED), rewrite.error
    assert str(2**80).encode() in rewrite.body
    assert not [r for r in records if r.levelno >= logging.WARNING]


async def test_compressed_bodies_are_inflated_off_the_event_loop(
    start_proxy: ProxyFactory,
    raw_upstream: RawUpstream,
    client: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inflating a body of up to the body limit takes a while: not on the loop's thread."""
    import threading

    import proxy.request_body as request_body

    threads: list[threading.Thread] = []
    inflate = request_body.decode_body

    def recording(wire: bytes, coding: str, limit: int) -> bytes:
        threads.append(threading.current_thread())
        return inflate(wire, coding, limit)

    monkeypatch.setattr(request_body, "decode_body", recording)
    proxy = await start_proxy([mark_first_item], upstream=[f"{raw_upstream.url}/v1"])
    status, _ = await post(client, f"{proxy.url}/v1/chat/completions", gzip.compress(CHAT), "gzip")
    assert status == 200
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with client.post(
        f"{proxy.url}/memory/import", data=gzip.compress(b"[]"), headers=headers
    ) as response:
        await response.read()
    assert len(threads) == 2
    assert all(thread is not threading.main_thread() for thread in threads)


# --- reading the body: whole when its length is known, as it comes when not -----------------


class _PausingProtocol:
    """What a request's body reader calls on its connection: the socket paused and resumed.
    Once resumed, the rest of the body arrives."""

    def __init__(self) -> None:
        self.paused = False
        self.on_resume: Callable[[], None] = lambda: None

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            asyncio.get_running_loop().call_soon(self.on_resume)


async def test_a_body_whose_socket_paused_before_the_handler_ran_is_read_whole() -> None:
    """Regression: a body of known length of which more than the reader's first limit (128 KB)
    came before the handler ran had paused the socket, and ``read_wire`` waited for the end
    of the body for ever (every 525 KB body under uvloop, which reads 256 KB at a time)."""
    body = b"x" * 600_000
    protocol = _PausingProtocol()
    payload = StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    payload.feed_data(body[:256_000])
    assert protocol.paused

    def rest() -> None:
        payload.feed_data(body[256_000:])
        payload.feed_eof()

    protocol.on_resume = rest
    transport = mock.Mock(spec=asyncio.Transport)
    transport.is_reading.side_effect = lambda: not protocol.paused
    request = make_mocked_request(
        "POST",
        "/v1/chat/completions",
        headers={"Content-Length": str(len(body))},
        payload=payload,
        client_max_size=1 << 20,
        transport=transport,
    )
    assert await asyncio.wait_for(read_wire(request), 5) == body


async def test_bodies_of_known_and_unknown_length_are_read_whole_and_limited(
    start_proxy: ProxyFactory, raw_upstream: RawUpstream, client: aiohttp.ClientSession
) -> None:
    """``read_wire`` waits for a body of known length to arrive whole, however slowly it
    comes, and reads a chunked one (no length) as it comes; either, over the limit, is a
    413 in the provider's shape that reaches no upstream."""
    proxy = await start_proxy(
        [mark_first_item], upstream=[f"{raw_upstream.url}/v1"], max_body_mb="1"
    )
    url = f"{proxy.url}/v1/chat/completions"
    big = _chat({"role": "user", "content": "x" * 600_000})
    wire = json.dumps(big).encode()

    async def trickled(data: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(data), 100_000):
            await asyncio.sleep(0.01)
            yield data[start : start + 100_000]

    # Known length, sent in pieces with pauses between them.
    headers = {"Content-Type": "application/json", "Content-Length": str(len(wire))}
    async with client.post(url, data=trickled(wire), headers=headers) as response:
        assert response.status == 200
    # Unknown length: chunked transfer encoding.
    async with client.post(
        url, data=trickled(wire), headers={"Content-Type": "application/json"}
    ) as response:
        assert response.status == 200
    assert len(raw_upstream.seen) == 2
    for _, body in raw_upstream.seen:
        forwarded = json.loads(body)
        assert forwarded["messages"][0]["content"] == "rewritten"  # read whole, then rewritten
        assert forwarded["messages"][1:] == big["messages"][1:]
    over = json.dumps(_chat({"role": "user", "content": "x" * 1_100_000})).encode()
    for data, headers in (
        (over, {"Content-Type": "application/json"}),
        (trickled(over), {"Content-Type": "application/json"}),
    ):
        async with client.post(url, data=data, headers=headers) as response:
            assert response.status == 413
            assert "1 MiB" in (await response.json())["error"]["message"]
    assert len(raw_upstream.seen) == 2


async def test_client_leaving_mid_body_ends_the_request_quietly(
    proxy: RunningProxy, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that announces more bytes than it sends and goes away: the read ends (no
    request left waiting for bytes that never come), nothing goes upstream, no traceback."""
    caplog.set_level(logging.DEBUG)
    port = int(proxy.url.rsplit(":", 1)[1])
    body = json.dumps(_chat(USER)).encode()
    for abort in (True, False):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body) + 1000, body)
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        if abort:
            writer.transport.abort()
        else:
            writer.close()
        await asyncio.sleep(0.2)

    def handling() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "RequestHandler" in repr(t.get_coro())]

    for _ in range(100):  # the proxy's request handlers end: none waits for the missing bytes
        if not handling():
            break
        await asyncio.sleep(0.02)
    assert not handling()
    assert upstream.requests == []
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert not noisy, [(r.name, r.getMessage()) for r in noisy]
