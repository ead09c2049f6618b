"""A minimal OpenAI-like provider for the overhead benchmark, run as its own process.

POST .../chat/completions, .../messages (Anthropic) and .../responses (OpenAI Responses) answer
a small JSON completion of their dialect, or an SSE stream when the body asks for
``"stream": true``: the first event at once, the rest ``--event-gap-ms`` apart. The body is
read in full but never parsed (a byte search finds ``stream``), so a large request costs the
provider the same little time whether it comes direct or through the proxy.

    python -m benchmarks.fake_provider --port 9000
    python benchmarks/fake_provider.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Mapping

import orjson
from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# A top-level ``"stream": true`` key; inside a JSON string the quotes would be escaped.
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')

WORDS = ("Hello", " from", " the", " fake", " provider.")


def _event(payload: object, name: str | None = None) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return (f"event: {name}\n" if name else "").encode() + f"data: {data}\n\n".encode()


def _chat_chunk(delta: dict[str, str], usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, object] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta}] if delta else [],
    }
    if usage is not None:
        body["usage"] = usage
    return _event(body)


def _named(*payloads: Mapping[str, object]) -> list[bytes]:
    return [_event(payload, str(payload["type"])) for payload in payloads]


# A dialect's JSON answer and its SSE events.
Answer = tuple[dict[str, object], list[bytes]]
CHAT: Answer = (
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "bench-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Done."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42},
    },
    [
        _chat_chunk({"role": "assistant", "content": ""}),
        *(_chat_chunk({"content": word}) for word in WORDS),
        _chat_chunk({}, {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}),
        _event("[DONE]"),
    ],
)
ANTHROPIC: Answer = (
    {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "bench-model",
        "content": [{"type": "text", "text": "Done."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 40, "output_tokens": 2},
    },
    _named(
        {
            "type": "message_start",
            "message": {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "bench-model",
                "content": [],
                "usage": {"input_tokens": 40, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
            for w in WORDS
        ),
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ),
)
RESPONSE: dict[str, object] = {
    "id": "resp_bench",
    "object": "response",
    "status": "completed",
    "model": "bench-model",
    "output": [
        {
            "type": "message",
            "id": "msg_bench",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 40, "output_tokens": 2, "total_tokens": 42},
}
RESPONSES: Answer = (
    RESPONSE,
    _named(
        {"type": "response.created", "response": {**RESPONSE, "status": "in_progress"}},
        *(
            {"type": "response.output_text.delta", "item_id": "msg_bench", "delta": w}
            for w in WORDS
        ),
        {"type": "response.completed", "response": RESPONSE},
    ),
)
ANSWERS: dict[str, Answer] = {  # by path suffix
    "chat/completions": CHAT,
    "messages": ANTHROPIC,
    "responses": RESPONSES,
}


def create_app(event_gap: float) -> web.Application:
    def answering(completion: dict[str, object], events: list[bytes]) -> Handler:
        whole = orjson.dumps(completion)

        async def answer(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if not STREAM_TRUE.search(body):
                return web.Response(body=whole, content_type="application/json")
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await response.prepare(request)
            with contextlib.suppress(ConnectionResetError):  # the client went away
                for index, event in enumerate(events):
                    if index and event_gap:
                        await asyncio.sleep(event_gap)
                    await response.write(event)
                await response.write_eof()
            return response

        return answer

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=1024**3)
    for suffix, (completion, events) in ANSWERS.items():
        app.router.add_post("/{prefix:.*}" + suffix, answering(completion, events))
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--event-gap-ms", type=float, default=1.0, help="between SSE events")
    args = parser.parse_args()
    web.run_app(
        create_app(args.event_gap_ms / 1000),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
