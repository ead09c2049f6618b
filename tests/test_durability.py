"""Nothing is lost: faults of the state database while requests keep coming, a data dir that
cannot be used at start, and pages corrupted at run time (real sockets, a real SQLite file)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest

from compressors.markers import ccr_key, marker_keys
from memory.db import DB_NAME
from proxy.cli import main as cli_main
from tests.conftest import RunningProxy
from tests.fake_upstream import FakeUpstream
from tests.test_proxy_compression import TOOLS, session_messages

SESSION = "ses_faults"
# Another process takes the write lock and holds it until its stdin closes.
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
db.execute("ROLLBACK")
"""


@pytest.fixture(autouse=True)
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A held lock fails a write after 50 ms instead of 5 s (the failure is the same)."""
    monkeypatch.setattr("memory.db.BUSY_TIMEOUT_SECONDS", 0.05)


def request_body(steps: int) -> bytes:
    return orjson.dumps(
        {"model": "m", "stream": True, "messages": session_messages(steps), "tools": TOOLS}
    )


async def post(client, proxy: RunningProxy, body: bytes, session: str = SESSION) -> None:
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
    ) as response:
        assert response.status == 200
        await response.read()


async def health(client, proxy: RunningProxy) -> tuple[int, dict]:
    async with client.get(proxy.url + "/health") as response:
        return response.status, await response.json()


def sent_keys(upstream: FakeUpstream) -> list[str]:
    keys = []
    for request in upstream.requests:
        for message in orjson.loads(request.body)["messages"]:
            keys += marker_keys(message.get("content") or "")
    return keys


def tool_outputs(steps: int) -> dict[str, str]:
    """Every tool output of the session by the key its marker would name."""
    return {
        ccr_key(m["content"]): m["content"] for m in session_messages(steps) if m["role"] == "tool"
    }


@asynccontextmanager
async def write_lock_held_by_another_process(db_path: Path) -> AsyncIterator[None]:
    locker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LOCKER,
        str(db_path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert locker.stdin is not None and locker.stdout is not None
    try:
        assert await locker.stdout.readline() == b"locked\n"
        yield
    finally:
        locker.stdin.close()
        await locker.wait()


@asynccontextmanager
async def disk_full(db: sqlite3.Connection) -> AsyncIterator[None]:
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite gets no new page: SQLITE_FULL
    try:
        yield
    finally:
        db.execute("PRAGMA max_page_count = 1073741823")


@asynccontextmanager
async def read_only(db: sqlite3.Connection) -> AsyncIterator[None]:
    # Root ignores file modes, so a read-only data dir is simulated where SQLite enforces it:
    # every write of the proxy's connection fails with SQLITE_READONLY.
    db.execute("PRAGMA query_only = ON")
    try:
        yield
    finally:
        db.execute("PRAGMA query_only = OFF")


async def test_every_marker_that_went_upstream_expands_after_write_faults_and_a_restart(
    start_proxy, upstream, client, tmp_path, caplog
):
    data_dir = tmp_path / "data"
    flags = {"upstream": [f"{upstream.url}/v1"], "data_dir": str(data_dir)}
    proxy = await start_proxy(**flags)
    db = proxy.state.stores.originals.db
    faults: list[tuple[str, Callable[[], object]]] = [
        ("database is locked", lambda: write_lock_held_by_another_process(data_dir / DB_NAME)),
        ("disk is full", lambda: disk_full(db)),
        ("readonly", lambda: read_only(db)),
    ]
    steps = 3
    for _ in range(2):
        await post(client, proxy, request_body(steps))
        steps += 1
    assert sent_keys(upstream), "the session is compressed before the faults"

    async def kept_ahead(steps: int) -> None:
        """Wait for the work done once the answer to ``request_body(steps)`` was out: the
        original of its latest output kept."""
        latest = ccr_key(session_messages(steps)[-1]["content"])
        for _ in range(3000):  # a bound for a busy machine, not a speed requirement
            if proxy.state.stores.originals.get(latest) is not None:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the latest output's original was not kept ahead")

    for why, fault in faults:
        await kept_ahead(steps - 1)
        async with fault():  # type: ignore[attr-defined]
            # The last step's output was kept once its answer was out, before the fault: the
            # next step, which compresses it, has nothing to write. Its own output cannot be
            # kept now, and the step after it, which compresses that one, fails open.
            await post(client, proxy, request_body(steps))
            assert marker_keys(orjson.loads(upstream.requests[-1].body)["messages"][-3]["content"])
            body = request_body(steps + 1)
            for _ in range(2):  # the client resends
                await post(client, proxy, body)
                assert upstream.requests[-1].body == body  # relayed unchanged: fail open
            status, report = await health(client, proxy)
            assert status == 503 and why in report["problems"]["state_db_writes"]
        await post(client, proxy, body)  # the same request once the database works again
        newly_compressed = session_messages(steps + 1)[-3]["content"]
        sent = orjson.loads(upstream.requests[-1].body)["messages"][-3]["content"]
        assert marker_keys(sent) == [ccr_key(newly_compressed)]
        status, report = await health(client, proxy)
        assert status == 200, report
        await post(client, proxy, request_body(steps + 2))
        steps += 3
    assert proxy.state.sessions.get(SESSION).tally.fail_opens == 2 * len(faults)
    assert not [r for r in caplog.records if r.exc_info], "a known failure logs no traceback"

    keys = set(sent_keys(upstream))
    await proxy.runner.cleanup()
    restarted = await start_proxy(**flags)
    originals = tool_outputs(steps)
    assert keys <= originals.keys()
    for key in sorted(keys):
        async with client.get(f"{restarted.url}/expand/ccr:{key}") as response:
            assert response.status == 200, f"ccr:{key} went upstream but was not kept"
            assert await response.read() == originals[key].encode()


async def wait_until_healthy(client, proxy: RunningProxy) -> None:
    for _ in range(3000):  # a bound for a busy machine, not a speed requirement
        status, _ = await health(client, proxy)
        if status == 200:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the proxy did not recover")


async def expand_over_mcp(client, proxy: RunningProxy, key: str) -> dict:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "deep_expand", "arguments": {"key": f"ccr:{key}"}},
    }
    async with client.post(proxy.url + "/mcp", json=message) as response:
        assert response.status == 200
        return (await response.json())["result"]


@pytest.mark.parametrize("cause", ["not a database", "a file where the data dir should be"])
async def test_without_a_durable_store_requests_are_relayed_until_it_opens(
    start_proxy, upstream, client, tmp_path, caplog, monkeypatch, cause
):
    data_dir = tmp_path / "data"
    if cause == "not a database":
        data_dir.mkdir()
        (data_dir / DB_NAME).write_bytes(b"these bytes are not an SQLite database\n" * 200)
    else:
        data_dir.write_text(cause)
    monkeypatch.setattr("proxy.app.STATE_RETRY_SECONDS", 0.01)
    flags = {"upstream": [f"{upstream.url}/v1"], "data_dir": str(data_dir)}
    with caplog.at_level(logging.ERROR):
        proxy = await start_proxy(**flags)
    body = request_body(4)
    await post(client, proxy, body)
    assert upstream.requests[-1].body == body  # nothing compressed: no marker without a store
    [error] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("state_db:")]
    assert str(data_dir) in error and "relaying every request unchanged" in error
    status, report = await health(client, proxy)
    assert status == 503 and report["status"] == "degraded"
    assert str(data_dir) in report["problems"]["state_db"]
    key = next(iter(tool_outputs(4)))
    async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "state_unavailable"

    if cause == "not a database":  # the operator fixes the data dir; no restart
        (data_dir / DB_NAME).unlink()
    else:
        data_dir.unlink()
    await wait_until_healthy(client, proxy)
    await post(client, proxy, body)
    keys = marker_keys(orjson.loads(upstream.requests[-1].body)["messages"][3]["content"])
    assert keys, "compressing once the state database opens"
    await proxy.runner.cleanup()
    restarted = await start_proxy(**flags)
    for key in keys:
        async with client.get(f"{restarted.url}/expand/ccr:{key}") as response:
            assert await response.read() == tool_outputs(4)[key].encode()


def corrupt_every_page_but_the_first(db_path: Path) -> None:
    """Garbage over the database's pages past the header page, as a failing disk leaves it.
    The checkpoint first moves every page into the main file (and makes the proxy's
    connection drop its page cache at its next read)."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.close()
    with db_path.open("r+b") as file:
        file.seek(page_size)
        file.write(b"\xff" * page_size * (pages - 1))


async def test_corrupt_pages_at_run_time_answer_state_unavailable_and_show_in_health(
    start_proxy, upstream, client, tmp_path, capsys
):
    data_dir = tmp_path / "data"
    flags = {"upstream": [f"{upstream.url}/v1"], "data_dir": str(data_dir)}
    first = await start_proxy(**flags)
    await post(client, first, request_body(3))
    [key, *_] = sent_keys(upstream)
    await first.runner.cleanup()
    proxy = await start_proxy(**flags)  # its cache is empty: expanding reads the database
    assert (await health(client, proxy))[0] == 200

    corrupt_every_page_but_the_first(data_dir / DB_NAME)
    async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
        assert response.status == 503
        error = (await response.json())["error"]
    assert error["code"] == "state_unavailable" and "malformed" in error["message"]
    status, report = await health(client, proxy)
    assert status == 503 and "malformed" in report["problems"]["state_db_reads"]
    result = await expand_over_mcp(client, proxy, key)
    assert result["isError"] is True and "malformed" in result["content"][0]["text"]
    assert cli_main(["expand", f"ccr:{key}", "--data-dir", str(data_dir)]) == 1
    assert "malformed" in capsys.readouterr().err

    body = request_body(4)
    await post(client, proxy, body)
    assert upstream.requests[-1].body == body  # fail open
    status, report = await health(client, proxy)
    assert "malformed" in report["problems"]["state_db_writes"]


def test_housekeeping_forgets_what_outlived_the_retention() -> None:
    import time
    from dataclasses import replace

    from memory.injection_memo import Injected
    from proxy.config import Settings
    from proxy.stores import open_stores

    stores = open_stores(replace(Settings(), retention_days=1e-7), in_memory=True)  # ~9 ms
    stores.originals.put_many({ccr_key("old output"): "old output"})
    stores.injections.add("gone", "anchor#0", Injected("recalled", 0))
    assert stores.injections.load("gone").turns == 1
    time.sleep(0.05)
    assert stores.housekeeping() == (1, 1)
    stores.injections.forget_live("gone")
    assert stores.injections.load("gone").turns == 0
    assert stores.originals.get(ccr_key("old output")) is None
