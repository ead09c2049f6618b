"""Keys, markers, the CCR store and every way to expand: HTTP, MCP, CLI."""

from __future__ import annotations

import subprocess
import sys
import time
from unittest import mock

import pytest

from compressors.markers import ccr_key, gap_line, marker, marker_keys, normalize_key
from compressors.outputs import Budget, ToolOutput
from compressors.registry import compress_output
from memory.ccr import OriginalStore, StoredKeys
from memory.db import DB_NAME, open_database
from memory.state import StateUnavailable
from tests.conftest import CAPTURES

ORIGINAL = "line one\nzwei — drei\n\U0001f600 emoji\nlone \udcff surrogate\nlast"


def test_key_scheme_and_marker_grammar():
    key = ccr_key(ORIGINAL)
    assert len(key) == 24 and int(key, 16) >= 0
    assert ccr_key(ORIGINAL) == key and ccr_key(ORIGINAL + " ") != key
    text = marker("412 of 480 lines omitted", key)
    assert (
        text
        == f'[deep-memory: 412 of 480 lines omitted — original intact: deep_expand("ccr:{key}")]'
    )
    assert marker_keys(f"before {text} after {text}") == [key, key]
    assert normalize_key(f"ccr:{key}") == key and normalize_key(key.upper()) == key
    assert normalize_key("ccr:xyz") is None
    assert gap_line(1) == "[… 1 line omitted …]" and gap_line(3, "items") == "[… 3 items omitted …]"


def test_store_round_trips_exact_bytes_and_survives_reopen(tmp_path):
    path = tmp_path / DB_NAME
    store = OriginalStore(open_database(path))
    key = ccr_key(ORIGINAL)
    assert store.put_many({key: ORIGINAL}) == 1
    assert store.put_many({key: ORIGINAL}) == 0  # cached: no second write
    assert store.get(f"ccr:{key}") == ORIGINAL.encode("utf-8", "surrogatepass")
    reopened = OriginalStore(open_database(path))
    assert reopened.get(key) == ORIGINAL.encode("utf-8", "surrogatepass")
    assert reopened.get("0" * 24) is None


def test_expired_originals_are_gone(tmp_path):
    store = OriginalStore(open_database(tmp_path / DB_NAME), retention_days=1)
    key = ccr_key(ORIGINAL)
    store.put_many({key: ORIGINAL})
    store.db.execute("UPDATE ccr_original SET last_used = last_used - 2 * 86400")
    fresh = OriginalStore(store.db, retention_days=1)
    assert fresh.get(key) is None
    assert fresh.purge_expired() == 1 and len(fresh) == 0


async def _seed(proxy) -> str:
    key = ccr_key(ORIGINAL)
    proxy.state.stores.originals.put_many({key: ORIGINAL})
    return key


async def test_http_expand(proxy, client):
    key = await _seed(proxy)
    async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
        assert response.status == 200
        assert await response.read() == ORIGINAL.encode("utf-8", "surrogatepass")
    async with client.get(f"{proxy.url}/expand/{key}?start_line=2&end_line=3") as response:
        assert (await response.read()).decode() == "zwei — drei\n\U0001f600 emoji"
    async with client.get(f"{proxy.url}/expand/ccr:{'a' * 24}") as response:
        assert response.status == 404
        error = await response.json()
    assert "unknown or expired" in error["error"]["message"]
    async with client.get(f"{proxy.url}/expand/not-a-key") as response:
        assert response.status == 404
        assert "not a deep-memory key" in (await response.json())["error"]["message"]


async def _rpc(client, url, method, params=None, id_=1):
    message = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if id_ is not None:
        message["id"] = id_
    async with client.post(
        url + "/mcp", json=message, headers={"Accept": "application/json, text/event-stream"}
    ) as response:
        if response.status == 202:
            return None
        assert response.status == 200
        return await response.json()


async def test_mcp_initialize_list_and_call(proxy, client):
    key = await _seed(proxy)
    init = await _rpc(
        client,
        proxy.url,
        "initialize",
        {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "opencode", "version": "1"},
        },
    )
    assert init["result"]["protocolVersion"] == "2025-03-26"
    assert init["result"]["capabilities"]["tools"] is not None
    assert await _rpc(client, proxy.url, "notifications/initialized", id_=None) is None
    tools = await _rpc(client, proxy.url, "tools/list", id_=2)
    by_name = {tool["name"]: tool for tool in tools["result"]["tools"]}
    assert set(by_name) == {"deep_expand", "memory_search", "memory_store", "memory_forget"}
    assert by_name["deep_expand"]["inputSchema"]["required"] == ["key"]
    call = await _rpc(
        client,
        proxy.url,
        "tools/call",
        {"name": "deep_expand", "arguments": {"key": f"ccr:{key}"}},
        id_=3,
    )
    assert call["result"]["isError"] is False
    assert call["result"]["content"][0]["text"] == ORIGINAL.encode("utf-8", "surrogatepass").decode(
        "utf-8", "replace"
    )
    missing = await _rpc(
        client,
        proxy.url,
        "tools/call",
        {"name": "deep_expand", "arguments": {"key": "ccr:" + "b" * 24}},
        id_=4,
    )
    assert missing["result"]["isError"] is True
    assert "unknown or expired" in missing["result"]["content"][0]["text"]
    bad = await _rpc(client, proxy.url, "nope", id_=5)
    assert bad["error"]["code"] == -32601
    async with client.get(proxy.url + "/mcp") as response:
        assert response.status == 405
    expands = proxy.state.metrics.counters["deepmem_expands_total"]
    assert expands[(("via", "mcp"),)] == 1


@pytest.mark.slow
def test_cli_expand_reads_the_data_dir(tmp_path):
    data = tmp_path / "data"
    store = OriginalStore(open_database(data / DB_NAME))
    key = ccr_key(ORIGINAL)
    store.put_many({key: ORIGINAL})
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "expand", f"ccr:{key}", "--data-dir", str(data)],
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == ORIGINAL.encode("utf-8", "surrogatepass")
    missing = subprocess.run(
        [sys.executable, "-m", "proxy", "expand", "f" * 24, "--data-dir", str(data)],
        capture_output=True,
        timeout=60,
    )
    assert missing.returncode == 1 and b"unknown or expired" in missing.stderr


def test_a_failed_write_keeps_nothing_and_the_next_put_writes_again(tmp_path, monkeypatch):
    monkeypatch.setattr("memory.db.BUSY_TIMEOUT_SECONDS", 0.05)
    path = tmp_path / DB_NAME
    store = OriginalStore(open_database(path))
    other = open_database(path)
    other.execute("BEGIN EXCLUSIVE")  # another connection holds the write lock
    key = ccr_key(ORIGINAL)
    with pytest.raises(StateUnavailable, match="database is locked"):
        store.put_many({key: ORIGINAL})
    assert store.get(key) is None  # not even in the cache: a cached key is a committed one
    other.execute("ROLLBACK")
    assert store.put_many({key: ORIGINAL}) == 1
    assert OriginalStore(open_database(path)).get(key) == ORIGINAL.encode("utf-8", "surrogatepass")


def test_originals_are_written_in_one_transaction(tmp_path):
    path = tmp_path / DB_NAME
    store = OriginalStore(open_database(path))
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages}")  # room for a small row, not a large one
    small, large = "a small original", "a large original\n" * 20_000
    with pytest.raises(StateUnavailable, match="full"):
        store.put_many({ccr_key(small): small, ccr_key(large): large})
    assert OriginalStore(open_database(path)).get(ccr_key(small)) is None
    assert store.get(ccr_key(small)) is None


def test_an_original_known_stored_is_written_again_only_when_its_refresh_is_due(tmp_path):
    """Every request hands over every original its markers name; each is written once per
    cache period (which refreshes its retention), and otherwise costs a lookup."""
    store = OriginalStore(open_database(tmp_path / DB_NAME), cache_seconds=600)
    key = ccr_key(ORIGINAL)
    assert store.put_many({key: ORIGINAL}) == 1
    assert store.put_many({key: ORIGINAL, ccr_key("another"): "another"}) == 1
    assert store.put_many({key: ORIGINAL}) == 0
    store.db.execute("UPDATE ccr_original SET last_used = 0")
    later = time.time() + 601
    with mock.patch("memory.ccr.time.time", return_value=later):
        assert store.put_many({key: ORIGINAL}) == 1  # due: written again, its use refreshed
    (last_used,) = store.db.execute(
        "SELECT last_used FROM ccr_original WHERE key = ?", (key,)
    ).fetchone()
    assert last_used == later


def test_the_stored_keys_are_bounded():
    keys = StoredKeys(seconds=10, max_keys=3)
    keys.add(["a", "b"], now=0)
    keys.add(["c"], now=5)
    assert keys.unknown({"a": "", "c": "", "d": ""}, now=6) == [("d", "")]
    keys.add(["d"], now=11)  # four: the two expired go
    assert keys.unknown({"a": "", "b": "", "c": "", "d": ""}, now=11) == [("a", ""), ("b", "")]
    keys.add(["e", "f", "g"], now=12)  # five unexpired: all go, each is written once more
    assert len(keys.unknown(dict.fromkeys("cdefg", ""), now=12)) == 5


# --- line ranges address the line numbers the model sees (issue 10, item 19) -------------------

READ_OUTPUT = (CAPTURES / "read-output-lines-2550-2769.txt").read_text(encoding="utf-8")


def _shown(first: int, last: int) -> bytes:
    """Lines first..last as the OpenCode read output shows them, ``N: `` prefix included."""
    wanted = [line for line in READ_OUTPUT.split("\n") if line.split(":")[0].isdigit()]
    return "\n".join(line for line in wanted if first <= int(line.split(":")[0]) <= last).encode()


def test_a_compressed_read_view_shows_the_numbers_that_expand_takes():
    output = ToolOutput(READ_OUTPUT, "read", '{"filePath": "src/extension.ts", "offset": 2550}')
    compressed = compress_output(output, Budget(len(READ_OUTPUT) // 4, 1))
    assert compressed is not None and compressed[0] == "file_read"
    assert compressed[1].omitted.endswith("(start_line/end_line: the line numbers shown)")
    shown = [line for line in compressed[1].text.split("\n") if line[:4].isdigit()]
    assert shown and set(shown) <= set(READ_OUTPUT.split("\n"))  # each with its own number


async def test_http_expand_ranges_use_the_numbers_shown_in_a_read_view(proxy, client):
    key = ccr_key(READ_OUTPUT)
    proxy.state.stores.originals.put_many({key: READ_OUTPUT})
    url = f"{proxy.url}/expand/ccr:{key}"
    async with client.get(f"{url}?start_line=2765&end_line=2767") as response:
        assert response.status == 200
        body = await response.read()
    assert body == _shown(2765, 2767)
    assert body.split(b"\n")[0] == b"2765: \t\tconst store = new AgentChatSessionStore({"
    async with client.get(f"{url}?start_line=2768") as response:  # to the end of the view
        assert await response.read() == _shown(2768, 2769)
    async with client.get(f"{url}?start_line=2767&end_line=2765") as response:
        assert response.status == 400
        error = (await response.json())["error"]
    assert error["code"] == "bad_range" and "after end_line" in error["message"]
    async with client.get(f"{url}?start_line=0&end_line=3") as response:
        assert response.status == 400 and (await response.json())["error"]["code"] == "bad_range"
    async with client.get(f"{url}?start_line=10&end_line=20") as response:
        assert response.status == 416
        error = (await response.json())["error"]
    assert error["code"] == "out_of_range" and "shows lines 2550-2769" in error["message"]


async def test_mcp_deep_expand_ranges_use_the_numbers_shown_and_reject_inverted_ones(proxy, client):
    key = ccr_key(READ_OUTPUT)
    proxy.state.stores.originals.put_many({key: READ_OUTPUT})
    tools = await _rpc(client, proxy.url, "tools/list")
    deep_expand = next(t for t in tools["result"]["tools"] if t["name"] == "deep_expand")
    assert "line numbers shown in a file view" in deep_expand["description"]
    assert (
        "line number shown" in deep_expand["inputSchema"]["properties"]["start_line"]["description"]
    )
    arguments = {"key": f"ccr:{key}", "start_line": 2600, "end_line": 2602}
    call = await _rpc(
        client, proxy.url, "tools/call", {"name": "deep_expand", "arguments": arguments}
    )
    assert call["result"]["isError"] is False
    assert call["result"]["content"][0]["text"].encode() == _shown(2600, 2602)
    arguments = {"key": f"ccr:{key}", "start_line": 2602, "end_line": 2600}
    call = await _rpc(
        client, proxy.url, "tools/call", {"name": "deep_expand", "arguments": arguments}
    )
    assert call["result"]["isError"] is True
    assert "after end_line" in call["result"]["content"][0]["text"]


@pytest.mark.slow
def test_cli_expand_ranges_use_the_numbers_shown_and_exit_2_on_an_inverted_range(tmp_path):
    data = tmp_path / "data"
    key = ccr_key(READ_OUTPUT)
    OriginalStore(open_database(data / DB_NAME)).put_many({key: READ_OUTPUT})
    command = [sys.executable, "-m", "proxy", "expand", key, "--data-dir", str(data)]
    run = subprocess.run(
        [*command, "--start-line", "2700", "--end-line", "2701"], capture_output=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == _shown(2700, 2701)
    inverted = subprocess.run(
        [*command, "--start-line", "2701", "--end-line", "2700"], capture_output=True, timeout=60
    )
    assert inverted.returncode == 2 and b"after end_line" in inverted.stderr


def test_expand_ranges_in_other_numbered_views_and_in_plain_text(tmp_path):
    from proxy.expand import expand

    store = OriginalStore(open_database(tmp_path / DB_NAME))
    header = "Here's the result of running `cat -n` on /repo/app.py:"
    cat_n = "\n".join([header, *(f"{n:6d}\tvalue_{n} = {n}" for n in range(40, 90))])
    plain = "\n".join(f"log line {n}" for n in range(1, 51))
    store.put_many({ccr_key(cat_n): cat_n, ccr_key(plain): plain})

    shown = expand(store, ccr_key(cat_n), 41, 42)
    assert shown.content == b"    41\tvalue_41 = 41\n    42\tvalue_42 = 42"
    tail = expand(store, ccr_key(cat_n), 88, 500)  # clipped to what the view shows
    assert tail.content == b"    88\tvalue_88 = 88\n    89\tvalue_89 = 89"
    outside = expand(store, ccr_key(cat_n), 1, 5)
    assert outside.content is None and outside.problem == "out_of_range"
    assert outside.error == (
        "lines 1-5: this file view shows lines 40-89 of the file (start_line/end_line are the "
        "line numbers shown in the view)"
    )
    # Without line numbers, ranges count the original's own lines.
    assert expand(store, ccr_key(plain), 2, 3).content == b"log line 2\nlog line 3"
    beyond = expand(store, ccr_key(plain), 60, 70)
    assert beyond.problem == "out_of_range" and "the original has 50 lines" in (beyond.error or "")
    inverted = expand(store, ccr_key(plain), 3, 2)
    assert inverted.problem == "bad_range" and inverted.content is None
