"""A scriptable fake LLM provider on a real loopback socket.

By default it answers the three chat dialects like a provider would (JSON, or SSE when the
body asks for ``stream``), echoing a marker of the request so tests can tell streams apart.
A test replaces ``handler`` to script anything else: errors, stalls, broken streams.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web


@dataclass
class Recorded:
    method: str
    path: str
    query_string: str
    raw_headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.raw_headers:
            if key.lower() == name.lower():
                return value
        return None

    def headers_named(self, name: str) -> list[str]:
        return [value for key, value in self.raw_headers if key.lower() == name.lower()]


Handler = Callable[[web.Request, bytes], Awaitable[web.StreamResponse]]


def sse(events: list[object], event_names: list[str] | None = None) -> list[bytes]:
    """Frame JSON payloads (or raw strings) as SSE events."""
    frames = []
    for index, event in enumerate(events):
        data = event if isinstance(event, str) else orjson.dumps(event).decode()
        name = event_names[index] if event_names else None
        prefix = f"event: {name}\n" if name else ""
        frames.append(f"{prefix}data: {data}\n\n".encode())
    return frames


def chat_stream(text: str, usage: tuple[int, int] = (100, 7)) -> list[bytes]:
    events: list[object] = [
        {"id": "c1", "object": "chat.completion.chunk", "choices": [{"delta": {"content": part}}]}
        for part in text.split(" ")
    ]
    events.append(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "choices": [],
            "usage": {
                "prompt_tokens": usage[0],
                "completion_tokens": usage[1],
                "prompt_tokens_details": {"cached_tokens": usage[0] // 2},
            },
        }
    )
    events.append("[DONE]")
    return sse(events)


def anthropic_stream(text: str, usage: tuple[int, int] = (100, 7)) -> list[bytes]:
    events = [
        {
            "type": "message_start",
            "message": {
                "id": "m1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "usage": {
                    "input_tokens": usage[0] - 60,
                    "cache_read_input_tokens": 50,
                    "cache_creation_input_tokens": 10,
                    "output_tokens": 1,
                },
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
            for t in text.split(" ")
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": usage[1]},
        },
        {"type": "message_stop"},
    ]
    return sse(events, [str(event["type"]) for event in events])


def responses_stream(text: str, usage: tuple[int, int] = (100, 7)) -> list[bytes]:
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": {"id": "r1", "status": "in_progress"}},
        *(
            {"type": "response.output_text.delta", "item_id": "i1", "delta": t}
            for t in text.split(" ")
        ),
        {
            "type": "response.completed",
            "response": {
                "id": "r1",
                "object": "response",
                "status": "completed",
                "usage": {
                    "input_tokens": usage[0],
                    "input_tokens_details": {"cached_tokens": usage[0] // 4},
                    "output_tokens": usage[1],
                },
            },
        },
    ]
    return sse(events, [str(event["type"]) for event in events])


STREAMS = {
    "/chat/completions": chat_stream,
    "/messages": anthropic_stream,
    "/responses": responses_stream,
}


def json_answer(path: str, text: str) -> dict[str, object]:
    if path.endswith("/messages"):
        return {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "usage": {"input_tokens": 40, "output_tokens": 5},
        }
    if path.endswith("/responses"):
        return {
            "id": "r1",
            "object": "response",
            "output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": 40, "output_tokens": 5},
        }
    return {
        "id": "c1",
        "object": "chat.completion",
        "choices": [{"message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 5},
    }


@dataclass
class FakeUpstream:
    """Records every request; answers through ``handler`` (the provider-like default)."""

    host: str = "127.0.0.1"
    requests: list[Recorded] = field(default_factory=list)
    handler: Handler | None = None
    chunk_delay: float = 0.0
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> FakeUpstream:
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                request.raw_path.partition("?")[2],
                [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers],
                body,
            )
        )
        handler = self.handler or self.provider_like
        return await handler(request, body)

    async def provider_like(self, request: web.Request, body: bytes) -> web.StreamResponse:
        try:
            parsed = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            return web.json_response({"error": {"message": "not json"}}, status=400)
        marker = request.headers.get("x-session-id", "anonymous")
        text = f"hello from upstream for {marker}"
        suffix = next((s for s in STREAMS if request.path.endswith(s)), None)
        if suffix is None:
            return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})
        if not (isinstance(parsed, dict) and parsed.get("stream")):
            return web.json_response(json_answer(request.path, text))
        return await stream_frames(request, STREAMS[suffix](text), self.chunk_delay)


async def stream_frames(
    request: web.Request, frames: list[bytes], delay: float = 0.0
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
        if delay:
            await asyncio.sleep(delay)
    await response.write_eof()
    return response
