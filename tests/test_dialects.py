"""Usage read from passing bytes, and error shapes per dialect."""

from __future__ import annotations

import gzip
import zlib

import orjson
import pytest

from compressors.view import Dialect
from compressors.wire import chat_dialect, error_body, error_style
from proxy.usage import UsageReader
from tests.fake_upstream import anthropic_stream, chat_stream, json_answer, responses_stream


def read_all(reader: UsageReader, data: bytes, step: int) -> None:
    for index in range(0, len(data), step):
        reader.feed(data[index : index + step])


@pytest.mark.parametrize("step", [1, 3, 64, 100_000])
@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (chat_stream, (100, 7, 50, 0)),
        (anthropic_stream, (100, 7, 50, 10)),
        (responses_stream, (100, 7, 25, 0)),
    ],
)
def test_usage_from_sse_split_anywhere(frames, expected, step):
    reader = UsageReader("text/event-stream; charset=utf-8", "")
    read_all(reader, b"".join(frames("a b c")), step)
    usage = reader.finish()
    assert usage is not None
    assert (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
    ) == expected


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_usage_from_json_response(path):
    reader = UsageReader("application/json", "")
    read_all(reader, orjson.dumps(json_answer(path, "x")), 5)
    usage = reader.finish()
    assert usage is not None and usage.input_tokens == 40 and usage.output_tokens == 5


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_usage_from_compressed_bodies(encoding):
    raw = b"".join(chat_stream("a b"))
    packed = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    reader = UsageReader("text/event-stream", encoding)
    read_all(reader, packed, 10)
    usage = reader.finish()
    assert usage is not None and usage.input_tokens == 100


def test_unreadable_bodies_yield_no_usage_and_never_raise():
    for content_type, encoding, data in [
        ("text/event-stream", "br", b"\x00\x01garbage"),
        ("text/event-stream", "gzip", b"not gzip at all"),
        ("application/json", "", b"{broken"),
        ("text/event-stream", "", b'data: {"usage": oops}\n\n'),
        ("text/plain", "", b"usage"),
    ]:
        reader = UsageReader(content_type, encoding)
        reader.feed(data)
        assert reader.finish() is None


def test_chat_routes():
    assert chat_dialect("POST", "/chat/completions") is Dialect.OPENAI_CHAT
    assert chat_dialect("POST", "/messages") is Dialect.ANTHROPIC
    assert chat_dialect("POST", "/responses") is Dialect.OPENAI_RESPONSES
    assert chat_dialect("POST", "/messages/count_tokens") is None
    assert chat_dialect("GET", "/responses") is None
    assert chat_dialect("POST", "/models") is None


def test_error_shapes():
    anthropic = orjson.loads(error_body(Dialect.ANTHROPIC, "m", "t", "c"))
    assert anthropic == {"type": "error", "error": {"type": "t", "message": "m"}}
    openai = orjson.loads(error_body(Dialect.OPENAI_CHAT, "m", "t", "c"))
    assert openai == {"error": {"message": "m", "type": "t", "code": "c"}}
    assert error_style("/messages/count_tokens", {}) is Dialect.ANTHROPIC
    assert error_style("/models", {"anthropic-version": "2023-06-01"}) is Dialect.ANTHROPIC
    assert error_style("/models", {}) is Dialect.OPENAI_CHAT
