"""The dashboard at /: the JSON index kept for scripts, the figures behind the page (prefix,
cache-aware cost, /stats and its session detail), and the page itself in headless Chromium."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import shutil
import struct
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from compressors.markers import marker_keys
from compressors.tokens import estimate_bytes_tokens
from proxy.costs import ANTHROPIC, OPENAI, PrefixTracker, StreamTokens, common_prefix_length
from proxy.sessions import RECENT_REQUESTS, SessionRegistry
from tests import debian
from tests.test_proxy_compression import TOOLS, session_messages

SESSION = "ses_dashboard"
OTHER = "ses_small"
CHAT = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'


# --- the longest common prefix ---------------------------------------------------------------


def naive_prefix(a: bytes, b: bytes) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_common_prefix_length_cases():
    assert common_prefix_length(b"", b"") == 0
    assert common_prefix_length(b"", b"abc") == 0
    assert common_prefix_length(b"abc", b"") == 0
    assert common_prefix_length(b"abc", b"abc") == 3
    assert common_prefix_length(b"abc", b"abcdef") == 3  # request t extends request t-1
    assert common_prefix_length(b"abcdef", b"abc") == 3
    assert common_prefix_length(b"xbc", b"abc") == 0
    assert common_prefix_length(b"abcx", b"abcy") == 3
    big = b"[" + b"x" * 1_000_000
    for at in (1, 2, 4095, 500_000, 999_999, 1_000_000):
        changed = big[:at] + b"y" + big[at + 1 :]
        assert common_prefix_length(big, changed) == at
        assert common_prefix_length(changed, big) == at
    cjk = "缓存前缀".encode()
    assert common_prefix_length(cjk, "缓存后缀".encode()) == 7  # bytes: 前, 后 share a lead byte


@given(st.binary(max_size=64), st.binary(max_size=64), st.binary(max_size=64))
def test_common_prefix_length_matches_a_byte_loop(shared, a, b):
    assert common_prefix_length(shared + a, shared + b) == naive_prefix(shared + a, shared + b)


@given(st.lists(st.tuples(st.text(max_size=40), st.text(max_size=40)), min_size=1, max_size=6))
def test_tracker_counts_only_tails_yet_equals_full_estimates(bodies):
    """The tracker scans only what differs from the previous body; its figures must equal
    the estimates of the whole bodies and of their shared prefixes."""
    tracker = PrefixTracker()
    previous: tuple[bytes, bytes] | None = None
    for n, (text_in, text_out) in enumerate(bodies):
        original, forwarded = ("前" + text_in).encode(), ("前" + text_out).encode()
        figures = tracker.observe(("s", "agent"), original, forwarded, ttl=300, now=float(n))
        assert figures.tokens_in == estimate_bytes_tokens(original)
        assert figures.tokens_out == estimate_bytes_tokens(forwarded)
        if previous is not None:
            shared_in = original[: common_prefix_length(previous[0], original)]
            shared_out = forwarded[: common_prefix_length(previous[1], forwarded)]
            assert figures.cached_in == estimate_bytes_tokens(shared_in)
            assert figures.cached_out == estimate_bytes_tokens(shared_out)
        previous = (original, forwarded)


# --- cache-aware cost ------------------------------------------------------------------------


def test_cost_arithmetic():
    assert ANTHROPIC.cost(1000, 0) == pytest.approx(1250.0)
    assert ANTHROPIC.cost(1000, 1000) == pytest.approx(100.0)
    assert ANTHROPIC.cost(1000, 800) == pytest.approx(0.1 * 800 + 1.25 * 200)
    assert OPENAI.cost(1000, 0) == pytest.approx(1000.0)
    assert OPENAI.cost(1000, 800) == pytest.approx(0.5 * 800 + 1.0 * 200)

    # 10 000 tokens sent, 9 000 of them cached; 4 000 forwarded, 3 000 of them cached.
    figures = StreamTokens(tokens_in=10_000, cached_in=9_000, tokens_out=4_000, cached_out=3_000)
    costs = figures.costs()
    assert costs["anthropic"] == {"original": 2150.0, "forwarded": 1550.0, "saved": 600.0}
    assert costs["openai"] == {"original": 5500.0, "forwarded": 2500.0, "saved": 3000.0}
    # Compression that breaks the cache can cost more than it saves: negative savings show.
    broken = StreamTokens(tokens_in=10_000, cached_in=9_000, tokens_out=8_000, cached_out=0)
    assert broken.costs()["anthropic"]["saved"] == pytest.approx(2150 - 10_000)

    # Costs are linear: the sum of requests is priced from the summed tokens.
    total = StreamTokens()
    total.add(figures)
    total.add(broken)
    for name in ("anthropic", "openai"):
        assert total.costs()[name]["saved"] == pytest.approx(
            figures.costs()[name]["saved"] + broken.costs()[name]["saved"]
        )


def test_prefix_tracker_per_stream_with_ttl_and_capacity():
    tracker = PrefixTracker(capacity=2)
    first = b'{"messages":[' + b'"a",' * 1000
    second = first + b'"b"]}'
    figures = tracker.observe(("s", "agent"), first, first, ttl=300, now=1000.0)
    assert (figures.cached_in, figures.cached_out) == (0, 0)  # nothing before it
    assert figures.tokens_in == figures.tokens_out == estimate_bytes_tokens(first)

    forwarded = b'{"messages":[' + b'"c",' * 10 + b'"b"]}'  # compressed: its prefix changed
    figures = tracker.observe(("s", "agent"), second, forwarded, ttl=300, now=1010.0)
    assert figures.cached_in == estimate_bytes_tokens(first)
    assert figures.cached_out == estimate_bytes_tokens(b'{"messages":[')
    assert figures.tokens_out == estimate_bytes_tokens(forwarded)

    # A title request in the same session is its own stream and leaves the agent's alone.
    title = tracker.observe(("s", "title"), b'{"title":1}', b'{"title":1}', ttl=300, now=1011.0)
    assert title.cached_in == 0
    again = tracker.observe(("s", "agent"), second, forwarded, ttl=300, now=1012.0)
    assert again.cached_in == again.tokens_in and again.cached_out == again.tokens_out

    # Past the cache lifetime nothing is cached, and old bodies are dropped.
    cold = tracker.observe(("s", "agent"), second, forwarded, ttl=300, now=1400.0)
    assert (cold.cached_in, cold.cached_out) == (0, 0)
    assert len(tracker) == 1

    # At most ``capacity`` streams keep their previous bodies.
    for n in range(5):
        tracker.observe((f"s{n}", "agent"), b"x", b"x", ttl=300, now=1500.0 + n)
    assert len(tracker) == 2
    assert tracker.observe(("s0", "agent"), b"x", b"x", ttl=300, now=1600.0).cached_in == 0
    # Requests without a session are counted, never compared.
    loose = tracker.observe(None, b"x", b"x", ttl=300, now=1601.0)
    assert loose.tokens_in == 1 and loose.cached_in == 0


def test_registry_ring_and_totals():
    registry = SessionRegistry(capacity=10)
    session = registry.touch("ses_ring", "default")
    body = b'{"messages":["' + b"y" * 400 + b'"]}'
    for _ in range(RECENT_REQUESTS + 5):
        record = registry.record_request(session, "agent", body, body, cache_ttl=300)
        record.status = 200
    assert len(session.recent) == RECENT_REQUESTS  # a bounded ring
    detail = session.detail()
    assert len(detail["recent_requests"]) == RECENT_REQUESTS
    assert detail["recent_requests"][-1]["status"] == 200
    tokens = estimate_bytes_tokens(body)
    count = RECENT_REQUESTS + 5
    assert registry.totals.request_tokens.tokens_in == count * tokens
    assert registry.totals.request_tokens.cached_in == (count - 1) * tokens


# --- the JSON index, /stats and the session detail through the proxy -------------------------


async def test_json_index_for_scripts_and_the_page_for_browsers(proxy, client):
    for headers, url in (
        ({"Accept": "application/json"}, "/"),
        ({"Accept": "*/*"}, "/"),  # curl and scripts keep the index
        ({}, "/?format=json"),
        ({"Accept": "text/html"}, "/?format=json"),
        ({"Accept": "text/html;q=0.5, application/json"}, "/"),
    ):
        async with client.get(proxy.url + url, headers=headers) as response:
            assert response.status == 200
            assert response.content_type == "application/json", (headers, url)
            index = await response.json()
        assert index["name"] == "deepmem" and "/stats" in index["endpoints"]
        assert index["upstreams"]["/v1/"].endswith("/v1")
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    for headers, url in (({"Accept": browser}, "/"), ({"Accept": "*/*"}, "/?format=html")):
        async with client.get(proxy.url + url, headers=headers) as response:
            assert response.status == 200
            assert response.content_type == "text/html"
            page = await response.text()
            policy = response.headers["Content-Security-Policy"]
        assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in page and "src=" not in page  # self-contained
        assert "default-src 'none'" in policy and "script-src 'sha256-" in policy
        assert "estimated" in page


async def _post(
    client: aiohttp.ClientSession, url: str, messages: list, session: str, model: str = "m"
) -> int:
    body = orjson.dumps({"model": model, "stream": True, "messages": messages, "tools": TOOLS})
    async with client.post(
        url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
    ) as response:
        await response.read()
        return response.status


async def _traffic(proxy, upstream, client) -> int:
    """A session whose tool outputs get compressed, one failed request, one expand."""
    messages = session_messages(14)
    steps = list(range(4, 31, 2))  # request k: the conversation up to step k
    for size in steps:
        assert await _post(client, proxy.url, messages[:size], SESSION) == 200

    async def failing(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.json_response({"error": {"message": "overloaded"}}, status=529)

    upstream.handler = failing
    assert await _post(client, proxy.url, messages, SESSION) == 529
    upstream.handler = None
    async with client.post(
        proxy.url + "/v1/chat/completions", data=CHAT, headers={"x-session-id": OTHER}
    ) as response:
        await response.read()
    sent = orjson.loads(upstream.requests[-2].body)["messages"]
    [key] = marker_keys(sent[3]["content"])
    async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
        assert response.status == 200
    return len(steps) + 1


async def test_stats_carry_request_tokens_costs_and_expands(proxy, upstream, client):
    requests = await _traffic(proxy, upstream, client)
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    totals = stats["totals"]
    assert totals["expands"] == 1
    assert totals["requests"] == requests + 1 and totals["errors"] == 1
    by_id = {s["session_id"]: s for s in stats["sessions"]}
    assert "recent_requests" not in by_id[SESSION]  # /stats stays small: the ring is in detail
    figures = by_id[SESSION]["request_tokens"]
    assert figures["tokens_after"] < figures["tokens_before"]
    assert 0 < figures["cached_before"] < figures["tokens_before"]
    assert figures["cost"]["anthropic"]["saved"] > 0 and figures["cost"]["openai"]["saved"] > 0
    assert totals["request_tokens"]["tokens_before"] > figures["tokens_before"]

    async with client.get(proxy.url + "/stats", params={"session": SESSION}) as response:
        assert response.status == 200
        detail = (await response.json())["session"]
    assert detail["requests"] == requests and detail["errors"] == 1
    ring = detail["recent_requests"]
    assert [r["status"] for r in ring] == [200] * (requests - 1) + [529]
    assert all(r["kind"] == "agent" for r in ring)
    assert ring[0]["cached_before"] == 0 and ring[1]["cached_before"] > 0
    assert sum(r["tokens_before"] for r in ring) == figures["tokens_before"]
    forwarded = [r.body for r in upstream.requests if r.header("x-session-id") == SESSION]
    assert [r["tokens_after"] for r in ring] == [estimate_bytes_tokens(b) for b in forwarded]

    async with client.get(proxy.url + "/stats", params={"session": "nope"}) as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "unknown_session"


async def test_session_detail_is_admin_only(start_proxy, upstream, client, monkeypatch):
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], admin_token="tok-123")
    async with client.post(
        proxy.url + "/v1/chat/completions", data=CHAT, headers={"x-session-id": OTHER}
    ) as response:
        await response.read()
    monkeypatch.setattr("proxy.admin.is_loopback", lambda remote: False)
    for url in ("/stats", f"/stats?session={OTHER}"):
        async with client.get(proxy.url + url) as response:
            assert response.status == 401  # the token is configured, and missing
        async with client.get(
            proxy.url + url, headers={"Authorization": "Bearer tok-123"}
        ) as response:
            assert response.status == 200
    async with client.get(proxy.url + "/", headers={"Accept": "text/html"}) as response:
        assert response.status == 200  # the page itself holds no data


# --- the page in headless Chromium -----------------------------------------------------------


def _find_chromium() -> str | None:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.access("/usr/bin/chromium", os.X_OK):
        found = "/usr/bin/chromium"
    return found


def chromium_or_fail() -> str:
    """Debian's headless Chromium, installed on first use like the e2e test installs OpenCode."""
    if os.environ.get("DEEPMEM_BROWSER") == "skip":
        pytest.skip("DEEPMEM_BROWSER=skip")
    found = _find_chromium()
    if found is None:
        output = debian.install("chromium")
        found = _find_chromium()
        if found is None:
            pytest.fail(
                "the dashboard test needs headless Chromium and could not install it: install "
                "Debian's chromium (apt-get install -y --no-install-recommends chromium), or set "
                f"DEEPMEM_BROWSER=skip\n{output}"
            )
    return found


class Page:
    """One Chromium tab driven over the DevTools protocol."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.next_id = 0

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        await self.socket.send_json({"id": ident, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.socket.receive_json(), 30)
            if message.get("id") == ident:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        href = orjson.dumps(url).decode()
        await self.wait_for(f"location.href === {href} && document.readyState === 'complete'")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                body = await self.evaluate("document.body.innerText")
                raise AssertionError(f"timed out waiting for {expression}; the page shows:\n{body}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> bytes:
        shot = await self.send("Page.captureScreenshot", format="png")
        data = base64.b64decode(shot["data"])
        path.write_bytes(data)
        return data


@contextlib.asynccontextmanager
async def chromium_page(tmp_path: Path) -> AsyncIterator[Page]:
    profile = tmp_path / "chromium-profile"
    process = await asyncio.create_subprocess_exec(
        chromium_or_fail(),
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-extensions",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and len(port_file.read_text().splitlines()) >= 2:
                break
            if process.returncode is not None:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("Chromium did not open its DevTools port within 30 s")
        if process.returncode is not None:
            error = await process.stderr.read() if process.stderr else b""
            raise AssertionError(f"Chromium exited: {error.decode(errors='replace')[-2000:]}")
        port = int(port_file.read_text().splitlines()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            [target] = [t for t in targets if t["type"] == "page"][:1]
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                page = Page(socket)
                await page.send("Page.enable")
                await page.send(
                    "Emulation.setDeviceMetricsOverride",
                    width=1280,
                    height=900,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                yield page
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def png_size_and_colours(data: bytes) -> tuple[int, int, int]:
    """Width, height and the number of distinct byte values of the pixel data."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    at, pixels = 8, b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        if kind == b"IDAT":
            pixels += data[at + 8 : at + 8 + length]
        at += 12 + length
    return width, height, len(set(zlib.decompress(pixels)))


def keep_artifact(shot: Path) -> None:
    target = os.environ.get("DEEPMEM_ARTIFACTS")
    if not target:
        return
    destination = Path(target)
    if destination.suffix.lower() != ".png":
        destination.mkdir(parents=True, exist_ok=True)
        destination = destination / shot.name
    else:
        destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, destination)


ROWS = "document.querySelectorAll('#sessions tbody tr').length"
BARS = "document.querySelectorAll('#chart svg g.req').length"


TITLE_REQUEST = orjson.dumps(
    {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": "You are a title generator. Output a thread title."},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": "Fix the billing report"},
        ],
    }
)


@pytest.mark.slow
async def test_dashboard_in_chromium(proxy, upstream, client, tmp_path):
    requests = await _traffic(proxy, upstream, client)
    async with client.post(
        proxy.url + "/v1/chat/completions", data=TITLE_REQUEST, headers={"x-session-id": SESSION}
    ) as response:
        await response.read()
    requests += 1
    async with chromium_page(tmp_path) as page:
        await page.navigate(proxy.url + "/")
        await page.wait_for(f"{ROWS} === 2")
        rows = await page.evaluate(
            """[...document.querySelectorAll('#sessions tbody tr')].map(row =>
                [row.dataset.session, ...[...row.cells].map(c => c.title || c.textContent)])"""
        )
        row = {cells[0]: cells[1:] for cells in rows}[SESSION]
        tally = proxy.state.sessions.get(SESSION).tally
        figures = tally.request_tokens
        removed = tally.tool_output_tokens_before - tally.tool_output_tokens_after
        costs = figures.costs()
        assert costs["anthropic"]["saved"] > 0 and costs["openai"]["saved"] > 0 and removed > 0
        # session, title, project, upstream, last seen, requests, received, compressed away
        # (with its share of received), memory added, model, saved ($), saved (units) x2,
        # errors: model "m" has no price, so its savings are in token units
        assert row[0] == SESSION and row[3] == "default"
        assert row[1] == proxy.state.sessions.get(SESSION).title and row[1]
        assert row[2] == "no project: memory went to the global memory"
        assert row[5:8] == [str(requests), f"{figures.tokens_in:,}", f"{removed:,}"]
        share = await page.evaluate(
            f"document.querySelector('tr[data-session=\"{SESSION}\"]').cells[7]"
            ".querySelector('span').textContent"
        )
        assert share == f" · {100 * removed / figures.tokens_in:.1f}%"
        assert row[8] == "0"  # no project, no memory blocks
        assert row[9:] == [
            "no price: token units",  # the model cell's title
            "–",
            f"{math.floor(costs['anthropic']['saved'] + 0.5):,}",  # JavaScript's Math.round
            f"{math.floor(costs['openai']['saved'] + 0.5):,}",
            "1",
        ]
        explained = await page.evaluate(
            "[...document.querySelectorAll('#sessions th[data-explain]')].map(th => th.title)"
        )
        assert explained and all(explained)

        totals = await page.evaluate(
            """Object.fromEntries([...document.querySelectorAll('#totals .card')].map(
                c => [c.dataset.k, c.querySelector('.value').textContent]))"""
        )
        assert totals["requests"] == str(requests + 1)
        assert totals["expands"] == "1" and totals["errors"] == "1"
        assert totals["tokens_injected"] == "0" and totals["tokens_removed"] != "0"
        assert "saved_money" not in totals and "saved_anthropic" in totals  # nothing priced
        assert "estimated" in await page.evaluate("document.body.innerText")
        card_titles = await page.evaluate(
            "[...document.querySelectorAll('#totals .card[title]')].map(c => c.dataset.k)"
        )
        assert {"tokens_before", "tokens_removed", "tokens_injected"} <= set(card_titles)

        # Select the small session, then the big one by clicking its row.
        await page.evaluate(f"document.querySelector('tr[data-session=\"{OTHER}\"]').click()")
        await page.wait_for(f"{BARS} === 1 && location.hash === '#session={OTHER}'")
        await page.evaluate(f"document.querySelector('tr[data-session=\"{SESSION}\"]').click()")
        await page.wait_for(f"{BARS} === {requests}")
        served_by = await page.evaluate(
            "[...document.querySelectorAll('#requests td.replica')].map(td => td.textContent)"
        )
        assert served_by == [proxy.state.replica] * requests  # newest first, this replica's
        assert await page.evaluate("document.getElementById('replicas-panel').hidden")
        assert await page.evaluate("document.querySelector('tr.selected').dataset.session") == (
            SESSION
        )
        heights = await page.evaluate(
            """[...document.querySelectorAll('#chart g.req')].map(g => [
                +g.querySelector('rect.before').getAttribute('height'),
                +g.querySelector('rect.after').getAttribute('height')])"""
        )
        assert all(before > 0 and after > 0 for before, after in heights)
        assert any(after < before for before, after in heights)  # compression shows
        assert await page.evaluate("document.querySelectorAll('#chart circle.err').length") == 1
        marks = "[...document.querySelectorAll('#chart text.mark')].map(t => t.textContent)"
        assert await page.evaluate(marks) == ["T"]  # the title request is marked
        assert SESSION in await page.evaluate("document.getElementById('detail-title').textContent")

        shot = tmp_path / "dashboard.png"
        data = await page.screenshot(shot)
    width, height, colours = png_size_and_colours(data)
    assert (width, height) == (1280, 900)
    assert len(data) > 20_000 and colours > 16, "the screenshot looks blank"
    keep_artifact(shot)


@pytest.mark.slow
async def test_dashboard_preselects_from_the_hash(proxy, upstream, client, tmp_path):
    await _traffic(proxy, upstream, client)
    async with chromium_page(tmp_path) as page:
        await page.navigate(f"{proxy.url}/#session={OTHER}")
        await page.wait_for(f"{BARS} === 1")
        assert await page.evaluate("document.querySelector('tr.selected').dataset.session") == (
            OTHER
        )


@pytest.mark.slow
async def test_dashboard_shows_dollars_for_a_priced_model(proxy, upstream, client, tmp_path):
    messages = session_messages(14)
    for size in range(4, 31, 2):
        assert await _post(client, proxy.url, messages[:size], SESSION, "gpt-4o") == 200
    money = proxy.state.sessions.get(SESSION).tally.money
    saved = money.original - money.forwarded
    assert money.requests == 14 and saved > 0
    async with chromium_page(tmp_path) as page:
        await page.navigate(proxy.url + "/")
        await page.wait_for(f"{ROWS} === 1")
        cells = await page.evaluate(
            "[...document.querySelector('#sessions tbody tr').cells].map(c => c.textContent)"
        )
        # model, saved ($), and no token units: every request was priced
        assert cells[9:12] == ["gpt-4o", f"${saved:.4f}" if saved < 1 else f"${saved:.2f}", "–"]
        assert cells[12] == "–"
        totals = await page.evaluate(
            """Object.fromEntries([...document.querySelectorAll('#totals .card')].map(
                c => [c.dataset.k, c.querySelector('.value').textContent]))"""
        )
        assert totals["saved_money"] == cells[10]
        assert "saved_anthropic" not in totals and "saved_openai" not in totals
        await page.wait_for(f"{BARS} === 14")
        tips = await page.evaluate(
            "[...document.querySelectorAll('#chart g.req title')].map(t => t.textContent)"
        )
        assert all("at list price" in tip for tip in tips)


@pytest.mark.slow
async def test_dashboard_asks_for_the_admin_token(
    start_proxy, upstream, client, tmp_path, monkeypatch
):
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], admin_token="tok-dash")
    await _post(client, proxy.url, session_messages(2), SESSION)
    monkeypatch.setattr("proxy.admin.is_loopback", lambda remote: False)  # as if remote
    async with chromium_page(tmp_path) as page:
        await page.navigate(proxy.url + "/")
        await page.wait_for("!document.getElementById('auth').hidden")
        assert await page.evaluate(ROWS) == 0

        async def submit(token: str) -> None:
            await page.evaluate(
                f"""document.getElementById('token').value = {orjson.dumps(token).decode()};
                document.getElementById('auth-form').requestSubmit()"""
            )

        await submit("wrong")
        await page.wait_for("document.getElementById('auth-error').textContent !== ''")
        await submit("tok-dash")
        await page.wait_for(f"{ROWS} === 1 && {BARS} === 1")
        assert await page.evaluate("document.getElementById('auth').hidden") is True
        stored = "sessionStorage.getItem('deepmem-admin-token')"
        assert await page.evaluate(stored) == "tok-dash"
        await page.send("Page.reload")  # the token survives a reload of the tab
        await page.wait_for(f"{ROWS} === 1")
        assert await page.evaluate("document.getElementById('auth').hidden") is True
