"""Upstream URL mistakes a new user makes: a start-up warning when a known provider's version
path is missing, and a hint (header + one log line) when an upstream answers 404 on a chat
route, with the provider's status and body passed on unchanged."""

from __future__ import annotations

import logging
import subprocess
import sys

import orjson
import pytest
from aiohttp import web

from proxy.config import load_settings, startup_warnings, suggested_upstream_url

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
PROVIDER_404 = (
    b'{"error":{"message":"Invalid URL (POST /chat/completions)","type":"invalid_request_error"}}'
)


@pytest.mark.parametrize(
    ("url", "suggestion"),
    [
        ("https://api.openai.com", "https://api.openai.com/v1"),
        ("https://api.openai.com/", "https://api.openai.com/v1"),
        ("https://api.openai.com/v1", None),
        ("https://api.openai.com/v1/", None),
        ("https://api.openai.com/chat/completions", "https://api.openai.com/v1"),
        ("https://api.anthropic.com", "https://api.anthropic.com/v1"),
        ("https://api.groq.com/v1", "https://api.groq.com/openai/v1"),
        ("https://api.groq.com/openai/v1", None),
        ("https://openrouter.ai/v1", "https://openrouter.ai/api/v1"),
        ("https://openrouter.ai/api/v1", None),
        (
            "https://generativelanguage.googleapis.com",
            "https://generativelanguage.googleapis.com/v1beta/openai",
        ),
        ("https://api.fireworks.ai/v1", "https://api.fireworks.ai/inference/v1"),
        ("https://api.deepseek.com", None),  # DeepSeek serves both
        ("https://api.deepseek.com/v1", None),
        ("http://127.0.0.1:8000", None),  # unknown hosts: no rule
    ],
)
def test_known_providers_get_their_version_path_suggested(url, suggestion):
    assert suggested_upstream_url(url) == suggestion


def test_startup_warns_about_a_missing_version_path_and_names_the_fix():
    settings = load_settings(
        {"upstream": ["https://api.openai.com", "groq=https://user:secret@api.groq.com/v1"]},
        environ={},
    )
    warnings = startup_warnings(settings, environ={})
    assert warnings == [
        "upstream 'default' is https://api.openai.com, without the path this provider's API "
        "lives under: requests will get 404; did you mean --upstream https://api.openai.com/v1?",
        "upstream 'groq' is https://<redacted>@api.groq.com/v1, without the path this "
        "provider's API lives under: requests will get 404; did you mean --upstream "
        "groq=https://api.groq.com/openai/v1?",
    ]
    assert startup_warnings(load_settings({}, environ={}), environ={}) == []


@pytest.mark.slow
def test_serve_logs_the_upstream_warning_at_start_up(tmp_path):
    served = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", "0", "--upstream", "https://api.x.ai"],
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": "/usr/bin:/bin", "DEEP_MEMORY_DATA_DIR": str(tmp_path)},
    )
    try:
        assert served.stderr is not None
        lines = [served.stderr.readline() for _ in range(2)]
    finally:
        served.terminate()
        served.wait(timeout=10)
    assert "WARNING" in lines[0]
    assert "did you mean --upstream https://api.x.ai/v1?" in lines[0]


async def test_a_404_on_a_chat_route_passes_unchanged_with_a_hint(
    start_proxy, upstream, client, caplog
):
    async def not_found(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=404, body=PROVIDER_404, content_type="application/json")

    upstream.handler = not_found
    # The fake upstream answers at any path, so this stands for "https://api.openai.com".
    proxy = await start_proxy(upstream=[upstream.url, f"openai={upstream.url}/v1"])
    with caplog.at_level(logging.WARNING, logger="deepmem.proxy"):
        for _ in range(2):
            async with client.post(proxy.url + "/v1/chat/completions", data=CHAT) as response:
                assert response.status == 404
                assert await response.read() == PROVIDER_404  # byte for byte
                hint = response.headers["X-Deepmem-Hint"]
        async with client.post(proxy.url + "/openai/chat/completions", data=CHAT) as response:
            assert response.status == 404
            assert "upstream 'openai'" in response.headers["X-Deepmem-Hint"]
        async with client.get(proxy.url + "/v1/models") as response:  # not a chat route
            assert response.status == 404 and "X-Deepmem-Hint" not in response.headers
    assert hint.startswith("the upstream answered 404 on a chat route: upstream 'default' is ")
    assert "version path (often /v1)" in hint
    hints = [r.getMessage() for r in caplog.records if "answered 404" in r.getMessage()]
    assert len(hints) == 2  # once per upstream, not once per request


def test_urls_in_warnings_and_hints_carry_no_credentials():
    from proxy.config import Upstream, upstream_hint

    upstream = Upstream("x", "https://user:pw@api.x.ai:8443/v1?api-key=k#f")
    hint = upstream_hint(upstream)
    assert "user" not in hint and "pw@" not in hint and "=k" not in hint
    assert "api.x.ai:8443/v1" in hint
    assert Upstream("x", "http://proxy:notaport/v1").public_url == "http://proxy:notaport/v1"
