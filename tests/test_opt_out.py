"""Opting out: the x-deep-memory: off header and the relay_models / relay_sessions globs make
the proxy forward a chat request byte for byte, counted in /stats as relayed with a reason."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from proxy.config import load_settings
from proxy.opt_out import OptOut
from tests.conftest import ProxyFactory, RunningProxy
from tests.fake_upstream import FakeUpstream
from tests.test_proxy_compression import TOOLS, session_messages


def _body(model: str = "m") -> bytes:
    # Three steps of 400-line file reads: the two older outputs are compressed unless opted out.
    return orjson.dumps({"model": model, "messages": session_messages(3), "tools": TOOLS})


async def _post(
    client: aiohttp.ClientSession, proxy: RunningProxy, body: bytes, **headers: str
) -> None:
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers=headers
    ) as response:
        assert response.status == 200
        await response.read()


async def _totals(client: aiohttp.ClientSession, proxy: RunningProxy) -> dict:
    async with client.get(proxy.url + "/stats") as response:
        return (await response.json())["totals"]


async def test_the_header_relays_the_exact_bytes_and_is_not_forwarded(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    body = _body()
    await _post(client, proxy, body, **{"x-session-id": "ses_off", "X-Deep-Memory": "Off"})
    sent = upstream.requests[-1]
    assert sent.body == body
    assert sent.header("x-deep-memory") is None
    assert sent.header("x-session-id") == "ses_off"

    await _post(client, proxy, body, **{"x-session-id": "ses_on"})
    assert upstream.requests[-1].body != body  # the same request without the header: compressed
    assert b"[deep-memory: " in upstream.requests[-1].body

    totals = await _totals(client, proxy)
    assert totals["relayed"] == {"header": 1}
    assert totals["requests"] == 2
    assert proxy.state.sessions.get("ses_off").tally.relayed == {"header": 1}
    assert proxy.state.sessions.get("ses_on").tally.relayed == {}


async def test_other_header_values_change_nothing(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    body = _body()
    await _post(client, proxy, body, **{"x-session-id": "ses_x", "x-deep-memory": "on"})
    assert b"[deep-memory: " in upstream.requests[-1].body
    assert upstream.requests[-1].header("x-deep-memory") is None  # deepmem's header, never sent


async def test_relay_models_globs_match_case_insensitively(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"], relay_models="GPT-4o-*, claude-*-haiku*"
    )
    for session, model in (("ses_a", "gpt-4o-mini"), ("ses_b", "claude-3-5-haiku-latest")):
        body = _body(model)
        await _post(client, proxy, body, **{"x-session-id": session})
        assert upstream.requests[-1].body == body

    body = _body("gpt-5")
    await _post(client, proxy, body, **{"x-session-id": "ses_c"})
    assert b"[deep-memory: " in upstream.requests[-1].body
    assert (await _totals(client, proxy))["relayed"] == {"relay_models": 2}


async def test_relay_sessions_globs(
    start_proxy: ProxyFactory, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], relay_sessions="ses_private*")
    body = _body()
    await _post(client, proxy, body, **{"x-session-id": "ses_private_42"})
    assert upstream.requests[-1].body == body
    await _post(client, proxy, body, **{"x-session-id": "ses_public"})
    assert b"[deep-memory: " in upstream.requests[-1].body
    assert (await _totals(client, proxy))["relayed"] == {"relay_sessions": 1}


async def test_non_chat_calls_do_not_forward_the_header(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    async with client.get(proxy.url + "/v1/models", headers={"x-deep-memory": "off"}) as answer:
        await answer.read()
    assert upstream.requests[-1].path == "/v1/models"
    assert upstream.requests[-1].header("x-deep-memory") is None


async def test_unread_bodies_are_counted_as_relayed_with_their_reason(
    proxy: RunningProxy, upstream: FakeUpstream, client: aiohttp.ClientSession
) -> None:
    for body in (b"not json", b'{"model": "m", "messages": "not a list"}'):
        async with client.post(proxy.url + "/v1/chat/completions", data=body) as response:
            await response.read()  # the provider's answer to it, whatever it is
        assert upstream.requests[-1].body == body
    assert (await _totals(client, proxy))["relayed"] == {"not_json": 1, "not_chat": 1}


@pytest.mark.parametrize(
    ("headers", "body", "reason"),
    [
        ({"x-deep-memory": " OFF "}, {"model": "m"}, "header"),
        ({"x-session-id": "ses_private_1"}, {"model": "m"}, "relay_sessions"),
        ({}, {"model": "Local-Llama-3"}, "relay_models"),
        ({}, {"model": "gpt-5"}, None),
        ({"x-session-id": "ses_public"}, ["not", "a", "dict"], None),
        ({"x-deep-memory": "on"}, {"model": 7}, None),
    ],
)
def test_reason(headers: dict[str, str], body: object, reason: str | None) -> None:
    settings = load_settings(
        {"relay_models": "local-*", "relay_sessions": "ses_private*"}, environ={}
    )
    assert OptOut.from_settings(settings).reason(headers, body) == reason
