"""A minimal OpenAI-like provider for the overhead benchmark, run as its own process.

POST .../chat/completions answers a small JSON completion, or an SSE stream when the body asks
for ``"stream": true``: the first event at once, the rest ``--event-gap-ms`` apart. The body is
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

import orjson
from aiohttp import web

# A top-level ``"stream": true`` key; inside a JSON string the quotes would be escaped.
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')

COMPLETION = orjson.dumps(
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
    }
)


def _event(payload: object) -> bytes:
    data = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
    return f"data: {data}\n\n".encode()


def _chunk(delta: dict[str, str], usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, object] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta}] if delta else [],
    }
    if usage is not None:
        body["usage"] = usage
    return _event(body)


EVENTS: list[bytes] = [
    _chunk({"role": "assistant", "content": ""}),
    *(_chunk({"content": word}) for word in ("Hello", " from", " the", " fake", " provider.")),
    _chunk({}, {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}),
    _event("[DONE]"),
]


def create_app(event_gap: float) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if not STREAM_TRUE.search(body):
            return web.Response(body=COMPLETION, content_type="application/json")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        with contextlib.suppress(ConnectionResetError):  # the client went away
            for index, event in enumerate(EVENTS):
                if index and event_gap:
                    await asyncio.sleep(event_gap)
                await response.write(event)
            await response.write_eof()
        return response

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=1024**3)
    app.router.add_post("/{prefix:.*}chat/completions", chat)
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
