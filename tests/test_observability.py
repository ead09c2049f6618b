"""/health, /stats, /metrics, admin access, Server-Timing and what the logs may carry."""

from __future__ import annotations

import logging
import re
from unittest import mock

from aiohttp.test_utils import make_mocked_request

from memory import semantic
from proxy.admin import admin_allowed
from proxy.app import STATE
from proxy.config import load_settings
from proxy.logs import JsonFormatter, body_for_log, redact_headers, redact_text

CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


async def test_health_ok_lists_upstreams(proxy, upstream, client):
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 200
        health = await response.json()
    assert health["status"] == "ok"
    assert health["upstreams"]["v1"] == f"{upstream.url}/v1"
    assert health["version"]
    assert health["memory_search"] == ("bm25+use-m3" if semantic.installed() else "bm25")


async def test_health_degraded_when_data_dir_unusable(start_proxy, upstream, client, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # fails for root too, unlike a chmod
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], data_dir=str(blocker / "d"))
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        health = await response.json()
    assert "data_dir" in health["problems"]


async def test_health_degraded_when_a_component_reports(proxy, client):
    proxy.state.health.report("data_dir", "/data is not writable: disk full")
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        health = await response.json()
    assert health["status"] == "degraded"
    assert health["problems"] == {"data_dir": "/data is not writable: disk full"}
    proxy.state.health.clear("data_dir")
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 200


async def test_stats_totals_and_per_session(proxy, client):
    for session in ("ses_1", "ses_1", "ses_2"):
        async with client.post(
            proxy.url + "/v1/chat/completions", data=CHAT, headers={"x-session-id": session}
        ) as response:
            await response.read()
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    totals = stats["totals"]
    assert totals["requests"] == 3 and totals["streams"] == 3 and totals["sessions"] == 2
    assert totals["bytes_in"] == 3 * len(CHAT) and totals["bytes_out"] == 3 * len(CHAT)
    assert totals["usage_seen"]["responses"] == 3
    assert totals["usage_seen"]["input_tokens"] == 300
    assert totals["errors"] == 0 and totals["fail_opens"] == 0 and totals["active_streams"] == 0
    by_id = {s["session_id"]: s for s in stats["sessions"]}
    assert by_id["ses_1"]["requests"] == 2 and by_id["ses_2"]["requests"] == 1
    assert by_id["ses_1"]["kinds"] == {"other": 2}
    assert by_id["ses_1"]["last_usage"]["output_tokens"] == 7


async def test_metrics_in_prometheus_text(proxy, client):
    async with client.post(proxy.url + "/v1/chat/completions", data=CHAT) as response:
        await response.read()
    async with client.get(proxy.url + "/metrics") as response:
        assert response.content_type == "text/plain"
        text = await response.text()
    assert 'deepmem_requests_total{route="openai-chat",status="200"} 1' in text
    assert 'deepmem_proxy_overhead_seconds_count{route="openai-chat"} 1' in text
    assert 'deepmem_proxy_overhead_seconds_bucket{route="openai-chat",le="+Inf"} 1' in text
    assert "# TYPE deepmem_active_streams gauge" in text
    assert "deepmem_active_streams 0" in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2


def _remote_request(address: str, headers: dict[str, str] | None = None):
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (address, 40000) if name == "peername" else default
    )
    return make_mocked_request("GET", "/stats", headers=headers or {}, transport=transport)


def test_admin_endpoints_loopback_only_unless_token():
    no_token = load_settings({}, environ={})
    with_token = load_settings({"admin_token": "s3cret-token"}, environ={})
    assert admin_allowed(_remote_request("127.0.0.1"), no_token)
    assert admin_allowed(_remote_request("::1"), no_token)
    assert not admin_allowed(_remote_request("172.17.0.1"), no_token)
    assert not admin_allowed(
        _remote_request("172.17.0.1", {"Authorization": "Bearer x"}), with_token
    )
    assert admin_allowed(
        _remote_request("172.17.0.1", {"Authorization": "Bearer s3cret-token"}), with_token
    )


def test_redaction_of_headers_and_bodies():
    headers = redact_headers(
        [
            ("Authorization", "Bearer sk-live-123456789"),
            ("x-api-key", "sk-ant-123456789"),
            ("x-session-id", "ses_1"),
        ]
    )
    assert headers == {
        "Authorization": "<redacted>",
        "x-api-key": "<redacted>",
        "x-session-id": "ses_1",
    }
    text = redact_text('{"apiKey": "abc", "note": "key sk-proj-abcdefghijk here"}')
    assert "abc" not in text and "sk-proj-abcdefghijk" not in text
    assert len(body_for_log(b"x" * 10_000)) < 4200


async def test_logs_never_carry_credentials(start_proxy, upstream, client, caplog):
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], log_bodies=True)
    secret = "sk-live-DO-NOT-LOG-0123456789"
    body = CHAT.replace(b'"model":"m"', b'"model":"m","api_key":"' + secret.encode() + b'"')
    with caplog.at_level(logging.DEBUG):
        async with client.post(
            proxy.url + "/v1/chat/completions",
            data=body,
            headers={"Authorization": f"Bearer {secret}", "x-api-key": secret},
        ) as response:
            await response.read()
    formatter = JsonFormatter()
    output = "\n".join(formatter.format(record) for record in caplog.records)
    assert "request body" in output, "log_bodies should log the body"
    assert secret not in output


async def test_server_timing_on_errors_too(start_proxy, client, unused_tcp_port):
    proxy = await start_proxy(upstream=[f"http://127.0.0.1:{unused_tcp_port}/v1"])
    async with client.post(proxy.url + "/v1/chat/completions", data=CHAT) as response:
        assert response.status == 502
        assert response.headers["Server-Timing"].startswith("deepmem;dur=")


async def test_access_log_says_what_the_rewrite_took_and_where(
    start_proxy, upstream, client, caplog
):
    """A chat request's access line carries its time before forwarding and the rewrite's own
    part of it, as its Server-Timing does; a call relayed unread has neither."""
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"])
    with caplog.at_level(logging.INFO, logger="deepmem.access"):
        async with client.post(proxy.url + "/v1/chat/completions", data=CHAT) as response:
            assert response.status == 200
            timing = response.headers["Server-Timing"]
            await response.read()
        async with client.get(proxy.url + "/v1/models") as response:
            await response.read()
        proxy.app[STATE].sessions.flush()  # the lines are written as the requests are counted
    lines = [r.fields for r in caplog.records if r.name == "deepmem.access"]
    chat, relayed = lines
    assert chat["rewritten_on"] == "worker"  # a session's first request
    assert 0 < chat["rewrite_ms"] <= chat["overhead_ms"] <= chat["ms"]
    found = re.search(r'rewrite;dur=([0-9.]+);desc="worker"', timing)
    assert found is not None and abs(float(found[1]) - chat["rewrite_ms"]) < 0.002
    assert "rewrite_ms" not in relayed and "overhead_ms" not in relayed
