"""Every rewrite visible: the per-request rewrite record (proxy/rewrites.py), through the running
proxy and a fake upstream, its bounds, and the admin protection of its endpoint."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from compressors.changes import SYSTEM_PROMPT, Change, ChangeKind
from compressors.markers import marker_keys
from memory.injection import RECALL_KIND, TAG
from proxy.rewrites import (
    MAX_TEXT_CHARS,
    RewriteLog,
    RewriteRecord,
    build_record,
)
from proxy.sessions import RequestRecord
from tests.test_compaction import compaction_body, transcript_of
from tests.test_dashboard import chromium_page, keep_artifact, png_size_and_colours
from tests.test_memory_injection import make_project, system_prompt
from tests.test_proxy_compression import numbered_file, session_messages

SESSION = "ses_rewrites"
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]
REASONING = "I should read the parser first, then the lexer. " * 4


def _call(call_id: str, path: str, reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "read", "arguments": json.dumps({"filePath": path})},
            }
        ],
    }
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def conversation(project: Path) -> list[dict[str, Any]]:
    """A finished turn that read the parser twice (the same output: a duplicate) with
    reasoning, then a new turn with one step."""
    parser = numbered_file("parser", lines=150)
    return [
        {"role": "system", "content": system_prompt(project)},
        {"role": "user", "content": "Fix the parser bug in the repo."},
        _call("call_1", "/repo/parser.py", REASONING),  # 2
        {"role": "tool", "tool_call_id": "call_1", "content": parser},  # 3
        _call("call_2", "/repo/parser.py"),  # 4
        {"role": "tool", "tool_call_id": "call_2", "content": parser},  # 5
        {"role": "assistant", "content": "Fixed: the parser skipped the last token."},
        {"role": "user", "content": "The pytest run of the fixture loader fails randomly"},  # 7
        _call("call_3", "/repo/lexer.py"),
        {"role": "tool", "tool_call_id": "call_3", "content": numbered_file("lexer")},
    ]


async def _post(
    client: aiohttp.ClientSession,
    url: str,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
) -> None:
    body = orjson.dumps({"model": "m", "stream": True, "messages": messages, "tools": TOOLS})
    async with client.post(
        url + "/v1/chat/completions",
        data=body,
        headers={"x-session-id": SESSION, **(headers or {})},
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()


async def _recent(client: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with client.get(url + "/stats", params={"session": SESSION}) as response:
        assert response.status == 200
        return list((await response.json())["session"]["recent_requests"])


async def _record(client: aiohttp.ClientSession, url: str, rewrite_id: str) -> dict[str, Any]:
    async with client.get(f"{url}/sessions/{SESSION}/requests/{rewrite_id}") as response:
        assert response.status == 200, await response.text()
        answer = await response.json()
    record: dict[str, Any] = answer["request"]
    return record


@pytest.fixture
async def memory_proxy(start_proxy, upstream, tmp_path):
    home, project = make_project(tmp_path)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    return proxy, project


async def test_the_record_shows_each_rewrite_and_its_original_expands(
    memory_proxy, upstream, client
):
    proxy, project = memory_proxy
    messages = conversation(project)
    await _post(client, proxy.url, messages, {"Authorization": "Bearer sk-secret-never-shown"})
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    [row] = await _recent(client, proxy.url)
    assert row["rewrite_id"]
    record = await _record(client, proxy.url, row["rewrite_id"])
    assert record["session_id"] == SESSION and record["kind"] == "agent"
    assert record["outcome"] == "rewritten" and record["project"] == str(project)
    assert record["bytes_out"] == len(upstream.requests[-1].body)
    assert "sk-secret" not in json.dumps(record)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for change in record["changes"]:
        by_kind.setdefault(change["kind"], []).append(change)

    # The first read, compressed: its marker is what went upstream, its key expands to the
    # original byte for byte.
    [compressed] = by_kind["compressed"]
    assert compressed["message"] == 3 and compressed["tool"] == "read" and compressed["new"]
    assert compressed["text"] == sent[3]["content"] and not compressed["text_truncated"]
    assert compressed["text"].startswith("[deep-memory: ")
    assert [compressed["key"]] == marker_keys(compressed["text"].split("\n", 1)[0])
    assert compressed["chars_before"] == len(messages[3]["content"])
    assert compressed["chars_after"] == len(sent[3]["content"])
    assert compressed["tokens_after"] < compressed["tokens_before"]
    async with client.get(f"{proxy.url}/expand/ccr:{compressed['key']}") as response:
        assert response.status == 200
        assert await response.read() == messages[3]["content"].encode()

    # The second, identical read: a pointer to the same original.
    [deduped] = by_kind["deduped"]
    assert deduped["message"] == 5 and deduped["text"] == sent[5]["content"]
    assert deduped["key"] == compressed["key"]

    # The finished turn's reasoning, dropped.
    [dropped] = by_kind["reasoning_dropped"]
    assert dropped["message"] == 2 and dropped["chars_before"] == len(REASONING)
    assert dropped["chars_after"] == 0 and "reasoning_content" not in sent[2]

    # The project's memory: a block after the system prompt, the text as forwarded.
    injected = by_kind["memory_injected"]
    stable = next(change for change in injected if change["message"] == SYSTEM_PROMPT)
    assert stable["blocks"] == ["project-memory"]
    assert stable["text"].startswith(f'<{TAG} kind="project-memory">')
    assert sent[0]["content"].startswith(messages[0]["content"])
    assert sent[0]["content"].endswith(stable["text"])
    assert stable["chars_after"] == len(stable["text"]) and stable["chars_before"] == 0
    # The newest user message's recall hits (MEMORY.md's gotcha on the fixture loader).
    recall = next(change for change in injected if change["message"] == 7)
    assert recall["blocks"][0] == RECALL_KIND and "fixture loader breaks" in recall["text"]
    assert sent[7]["content"].startswith(messages[7]["content"])
    assert sent[7]["content"].endswith(recall["text"])

    # The same request again: the same rewrites, now re-applied (not decided anew).
    await _post(client, proxy.url, messages)
    again = await _record(client, proxy.url, (await _recent(client, proxy.url))[-1]["rewrite_id"])
    assert [(c["kind"], c["message"], c["text"]) for c in again["changes"]] == [
        (c["kind"], c["message"], c["text"]) for c in record["changes"]
    ]
    assert not any(c["new"] for c in again["changes"] if c["kind"] != "reasoning_dropped")


async def test_a_compactions_record_shows_its_transcript_and_prompt(proxy, upstream, client):
    body = compaction_body(transcript_of(session_messages(4)[1:]))
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"x-session-id": SESSION},
    ) as response:
        assert response.status == 200
        await response.read()
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    [row] = await _recent(client, proxy.url)
    record = await _record(client, proxy.url, row["rewrite_id"])
    assert record["kind"] == "compaction"
    transcript, prompt = record["changes"]
    assert transcript["kind"] == "transcript_compressed" and transcript["message"] == 1
    assert transcript["chars_before"] == len(body["messages"][1]["content"])
    assert transcript["chars_after"] == len(sent[1]["content"])
    assert sent[1]["content"].startswith(transcript["text"])  # capped at MAX_TEXT_CHARS
    assert transcript["keys"] == marker_keys(sent[1]["content"])
    for key in transcript["keys"]:
        async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
            assert (await response.text()) in body["messages"][1]["content"]
    assert prompt["kind"] == "prompt_changed" and prompt["message"] == SYSTEM_PROMPT
    assert prompt["blocks"] == ["handoff"] and sent[0]["content"].endswith(prompt["text"])


async def test_a_failing_record_never_fails_the_request(proxy, upstream, client, monkeypatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the record")

    monkeypatch.setattr("proxy.app.build_record", broken)
    messages = conversation(Path("/nowhere"))
    await _post(client, proxy.url, messages)
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    assert sent[3]["content"].startswith("[deep-memory: ")  # rewritten all the same
    [row] = await _recent(client, proxy.url)
    assert row["rewrite_id"] is None and row["status"] == 200


async def test_a_request_relayed_untouched_has_a_record_without_changes(proxy, upstream, client):
    await _post(client, proxy.url, conversation(Path("/nowhere")), {"x-deep-memory": "off"})
    [row] = await _recent(client, proxy.url)
    record = await _record(client, proxy.url, row["rewrite_id"])
    assert record["outcome"] == "opted_out" and record["reason"] == "header"
    assert record["changes"] == [] and record["bytes_in"] == record["bytes_out"]


async def test_an_unknown_request_says_where_records_live(proxy, client):
    async with client.get(f"{proxy.url}/sessions/{SESSION}/requests/abc-1") as response:
        assert response.status == 404
        error = (await response.json())["error"]
    assert error["code"] == "unknown_request"
    assert proxy.state.replica in error["message"] and "another replica" in error["message"]


async def test_the_record_endpoint_is_an_admin_endpoint(proxy, upstream, client, monkeypatch):
    await _post(client, proxy.url, conversation(Path("/nowhere")))
    [row] = await _recent(client, proxy.url)
    url = f"{proxy.url}/sessions/{SESSION}/requests/{row['rewrite_id']}"
    for headers, code in (
        ({"Host": "evil.example"}, "host_not_allowed"),  # DNS rebinding
        ({"Origin": "http://evil.example"}, "cross_site"),
        ({"Sec-Fetch-Site": "cross-site"}, "cross_site"),
    ):
        async with client.get(url, headers=headers) as response:
            assert response.status == 403
            assert (await response.json())["error"]["code"] == code
    same_origin = {"Origin": proxy.url, "Sec-Fetch-Site": "same-origin"}
    async with client.get(url, headers=same_origin) as response:
        assert response.status == 200  # what the dashboard's fetch sends
    monkeypatch.setattr("proxy.admin.is_loopback", lambda remote: False)
    async with client.get(url) as response:
        assert response.status == 403
        assert (await response.json())["error"]["code"] == "admin_only"


# --- the log's bounds ------------------------------------------------------------------------


def _record_of(log: RewriteLog, session: str, text: str = "x", at: float | None = None):
    change = Change(ChangeKind.COMPRESSED, 3, 10_000, len(text), text, "read", "a" * 24)
    record = build_record(log.new_id(), session, "agent", "rewritten", "r1", [change])
    if at is not None:
        record.at = at
    log.add(record)
    return record


def test_a_change_text_is_capped():
    log = RewriteLog(retention_seconds=3600)
    record = _record_of(log, "s", "y" * (MAX_TEXT_CHARS * 3))
    [change] = record.as_dict()["changes"]
    assert len(change["text"]) == MAX_TEXT_CHARS and change["text_truncated"]
    assert change["text_chars"] == MAX_TEXT_CHARS * 3
    assert record.size < 2 * MAX_TEXT_CHARS  # what it holds, not what was forwarded


def test_the_log_keeps_the_last_requests_of_the_last_sessions():
    log = RewriteLog(retention_seconds=3600, per_session=3, max_sessions=2)
    first = [_record_of(log, "a") for _ in range(5)]
    assert [log.get("a", r.id) is not None for r in first] == [False, False, True, True, True]
    b = _record_of(log, "b")
    _record_of(log, "a")  # "a" recorded most recently: "b" is the least recent
    c = _record_of(log, "c")
    assert log.get("b", b.id) is None and log.get("c", c.id) is c
    assert log.get("a", first[-1].id) is not None
    assert log.get("c", first[-1].id) is None  # an id is looked up in its own session only
    assert len(log) == 4
    assert log.bytes == sum(r.size for r in _all(log))


def test_the_log_stays_under_its_byte_cap():
    one = _record_of(RewriteLog(3600), "s", "z" * 1000).size
    log = RewriteLog(retention_seconds=3600, max_bytes=one * 3 + one // 2)
    records = [_record_of(log, f"s{n % 2}", "z" * 1000) for n in range(10)]
    assert len(log) == 3 and log.bytes <= log.max_bytes
    assert [log.get(r.session_id, r.id) is not None for r in records] == [False] * 7 + [True] * 3
    huge = RewriteLog(retention_seconds=3600, max_bytes=10)
    newest = _record_of(huge, "s", "z" * 1000)
    assert huge.get("s", newest.id) is newest  # the newest record always stays


def test_no_record_outlives_the_retention(monkeypatch):
    log = RewriteLog(retention_seconds=100)
    now = 1_000_000.0
    monkeypatch.setattr("proxy.rewrites.time.time", lambda: now)
    old = _record_of(log, "a", at=now - 150)
    fresh = _record_of(log, "b", at=now - 50)
    assert log.get("a", old.id) is None and log.get("b", fresh.id) is fresh
    now += 60
    assert log.get("b", fresh.id) is None and len(log) == 0 and log.bytes == 0


def test_a_record_added_looks_only_at_the_sessions_recorded_before_any_live_one(monkeypatch):
    """Adding a record walked every session of the log (up to 200) for expired records; it
    drops the sessions recorded least recently while their newest record has expired, and a
    reader still never gets an expired record (it looks at every session first)."""
    log = RewriteLog(retention_seconds=100)
    now = 1_000_000.0
    monkeypatch.setattr("proxy.rewrites.time.time", lambda: now)
    gone = _record_of(log, "gone", at=now - 150)
    old = _record_of(log, "mixed", at=now - 120)
    live = _record_of(log, "mixed", at=now - 10)
    _record_of(log, "new", at=now)
    assert "gone" not in log._sessions  # recorded first and expired: dropped
    assert len(log._sessions["mixed"]) == 2  # its expired record waits for a reader
    assert log.bytes == sum(r.size for r in _all(log))
    assert log.get("mixed", old.id) is None and log.get("mixed", live.id) is live
    assert log.get("gone", gone.id) is None and log.bytes == sum(r.size for r in _all(log))


def test_a_log_at_its_byte_cap_drops_from_the_least_recent_sessions_without_a_walk(monkeypatch):
    """At the byte cap (a long-running proxy's steady state) adding a record walked every
    session too; it drops the least recently recorded sessions' oldest records, and an expired
    record of a session further on waits for a reader as below."""
    now = 1_000_000.0
    monkeypatch.setattr("proxy.rewrites.time.time", lambda: now)
    one = _record_of(RewriteLog(100), "s", "z" * 1000).size
    log = RewriteLog(retention_seconds=100, max_bytes=one * 3)
    old = _record_of(log, "mixed", "z" * 1000, at=now - 120)
    live = _record_of(log, "mixed", "z" * 1000, at=now - 10)
    first = _record_of(log, "first", "z" * 1000, at=now - 5)
    _record_of(log, "mixed", "z" * 1000, at=now)  # "first" is now the least recent
    assert "first" not in log._sessions and log.bytes <= log.max_bytes
    assert len(log._sessions["mixed"]) == 3  # its expired record was not looked for
    assert log.get("first", first.id) is None and log.get("mixed", old.id) is None
    assert log.get("mixed", live.id) is live and log.bytes == sum(r.size for r in _all(log))


def _all(log: RewriteLog) -> list[RewriteRecord]:
    return [record for records in log._sessions.values() for record in records]


def test_request_rows_carry_the_record_id_and_read_older_rows():
    record = RequestRecord.from_row([1.0, "agent", 200, 10, 0, 8, 0, 2, 0, "ab-1"], "r1")
    assert record.rewrite_id == "ab-1" and record.row()[-1] == "ab-1"
    older = RequestRecord.from_row([1.0, "agent", 200, 10, 0, 8, 0, 2, 0], "r2")
    assert older.rewrite_id is None and older.as_dict()["rewrite_id"] is None


# --- the request view in headless Chromium ----------------------------------------------------

REQUEST_ROWS = "document.querySelectorAll('#requests tbody tr').length"
VIEW_STATE = "document.getElementById('request-view').dataset.state"


@pytest.mark.slow
async def test_the_request_view_in_chromium(memory_proxy, upstream, client, tmp_path):
    proxy, project = memory_proxy
    messages = conversation(project)
    await _post(client, proxy.url, messages)
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    async with chromium_page(tmp_path) as page:
        await page.navigate(f"{proxy.url}/#session={SESSION}")
        await page.wait_for(f"{REQUEST_ROWS} === 1")
        assert await page.evaluate("document.getElementById('request-view').hidden")
        await page.evaluate("document.querySelector('#requests tbody tr').click()")
        await page.wait_for(f"{VIEW_STATE} === 'shown'")
        assert "&request=" in await page.evaluate("location.hash")
        kinds = await page.evaluate(
            "[...document.querySelectorAll('#request-changes .change')].map(c => c.dataset.kind)"
        )
        assert sorted(set(kinds)) == [
            "compressed",
            "deduped",
            "memory_injected",
            "reasoning_dropped",
        ]
        shown = await page.evaluate(
            """[...document.querySelectorAll('#request-changes .change')].map(c => [
                c.dataset.kind, c.querySelector('.head').textContent,
                (c.querySelector('pre.sent') || {}).textContent || null])"""
        )
        compressed = next(change for change in shown if change[0] == "compressed")
        assert compressed[2] == sent[3]["content"]  # the marker and compressed text as sent
        assert "message 3" in compressed[1] and "tool read" in compressed[1]
        assert (
            f"{len(messages[3]['content']):,} chars → {len(sent[3]['content']):,} chars"
            in (compressed[1])
        )
        memory = next(change for change in shown if change[0] == "memory_injected")
        assert "system prompt" in memory[1] and "project-memory" in memory[1]
        assert memory[2] is not None and sent[0]["content"].endswith(memory[2])

        # Expand: the original, fetched from /expand by the page, byte for byte.
        change = "document.querySelector('.change[data-kind=compressed]')"
        await page.evaluate(f"{change}.querySelector('a.expand').click()")
        await page.wait_for(f"!!{change}.querySelector('pre.expanded')")
        expanded = await page.evaluate(f"{change}.querySelector('pre.expanded').textContent")
        assert expanded == messages[3]["content"]

        # The view stays as it is while the page polls (the original stays expanded).
        await asyncio.sleep(2.5)
        assert await page.evaluate(f"!!{change}.querySelector('pre.expanded')")
        await page.evaluate(
            "document.getElementById('request-view').scrollIntoView({block: 'start'})"
        )
        shot = tmp_path / "dashboard-request.png"
        data = await page.screenshot(shot)
    width, height, colours = png_size_and_colours(data)
    assert (width, height) == (1280, 900)
    assert len(data) > 20_000 and colours > 16, "the screenshot looks blank"
    keep_artifact(shot)


@pytest.mark.slow
async def test_the_request_view_says_where_a_record_is(memory_proxy, upstream, client, tmp_path):
    proxy, project = memory_proxy
    messages = conversation(project)
    await _post(client, proxy.url, messages)
    await _post(client, proxy.url, messages)
    older, newer = proxy.state.sessions.get(SESSION).recent
    older.replica = "replica-b"  # as if another replica had served it
    proxy.state.rewrite_log._sessions.clear()  # the newer one's record gone (a restart)
    async with chromium_page(tmp_path) as page:
        await page.navigate(f"{proxy.url}/#session={SESSION}&request={older.rewrite_id}")
        await page.wait_for(f"{VIEW_STATE} === 'missing'")
        text = await page.evaluate("document.getElementById('request-changes').textContent")
        assert "Replica replica-b served this request" in text
        assert proxy.state.replica in text
        await page.evaluate("document.querySelector('#requests tbody tr').click()")  # newest
        await page.wait_for(
            f"{VIEW_STATE} === 'missing' && document.getElementById('request-view')"
            f".dataset.request === {orjson.dumps(newer.rewrite_id).decode()}"
        )
        text = await page.evaluate("document.getElementById('request-changes').textContent")
        assert "no record of request" in text and "lost on restart" in text


def test_a_capped_change_keeps_every_other_field():
    change = Change(
        ChangeKind.TRANSCRIPT_COMPRESSED,
        4,
        90_000,
        9_000,
        "t" * 9_000,
        "bash",
        "b" * 24,
        ("c" * 24,),
        22_500,
        2_250,
        False,
        ("handoff",),
    )
    capped = change.capped(100)
    assert capped.text == "t" * 100 and change.text == "t" * 9_000
    assert {**asdict(capped), "text": ""} == {**asdict(change), "text": ""}
    assert change.capped(9_000) is change
