"""Compression through the running proxy: what the upstream receives, expand, restarts."""

from __future__ import annotations

import copy
import json

import orjson

from compressors.markers import marker_keys
from memory.ccr import OriginalStore
from memory.db import DB_NAME, open_database
from tests.fake_upstream import FakeUpstream


def numbered_file(name: str, lines: int = 400) -> str:
    body = "\n".join(
        f"{n}: def {name}_function_{n}(value_{n}):  # handles {name} case {n}"
        for n in range(1, lines + 1)
    )
    return f"<path>/repo/{name}.py</path>\n<type>file</type>\n<content>\n{body}\n</content>"


def session_messages(steps: int) -> list[dict]:
    messages = [
        {"role": "system", "content": "You are OpenCode."},
        {"role": "user", "content": "Fix the parser bug in the repo."},
    ]
    for index in range(steps):
        call_id = f"call_{index}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": f"step {index}: I should read file {index}",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "read",
                            "arguments": json.dumps({"filePath": f"/repo/f{index}.py"}),
                        },
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": numbered_file(f"module{index}")}
        )
    return messages


TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {}}}]


async def _post(client, proxy, messages, session="ses_compress"):
    body = orjson.dumps({"model": "m", "stream": True, "messages": messages, "tools": TOOLS})
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
    ) as response:
        assert response.status == 200
        await response.read()


async def test_older_outputs_arrive_compressed_and_expand(proxy, upstream, client):
    messages = session_messages(3)
    await _post(client, proxy, messages)
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    assert sent[-1] == messages[-1]  # the latest step in full
    assert sent[-2] == messages[-2]  # the live turn's reasoning and calls untouched
    for index in (3, 5):
        assert sent[index]["content"].startswith("[deep-memory: ")
        [key] = marker_keys(sent[index]["content"])
        async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
            assert response.status == 200
            assert (await response.read()).decode() == messages[index]["content"]
    stats = proxy.state.sessions.get("ses_compress").tally
    assert stats.outputs_compressed == 2
    assert stats.tool_output_tokens_after < stats.tool_output_tokens_before


async def test_same_bytes_after_a_restart(start_proxy, upstream, client, tmp_path):
    data_dir = str(tmp_path / "shared-data")
    flags = {"upstream": [f"{upstream.url}/v1"], "data_dir": data_dir}
    messages = session_messages(4)
    first = await start_proxy(**flags)
    await _post(client, first, messages[:8])
    await _post(client, first, messages)
    before = upstream.requests[-1].body
    await first.runner.cleanup()

    again = await start_proxy(**flags)
    await _post(client, again, messages)
    assert upstream.requests[-1].body == before


async def test_compression_off_is_a_pure_relay(start_proxy, upstream: FakeUpstream, client):
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], compress="false")
    messages = session_messages(3)
    body = orjson.dumps({"model": "m", "messages": copy.deepcopy(messages), "tools": TOOLS})
    async with client.post(proxy.url + "/v1/chat/completions", data=body) as response:
        await response.read()
    assert upstream.requests[-1].body == body


async def test_disk_full_fails_open_and_is_reported(proxy, upstream, client):
    db = proxy.state.stores.originals.db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full: SQLite gets no new page
    messages = session_messages(3)
    await _post(client, proxy, messages, session="ses_full")
    assert orjson.loads(upstream.requests[-1].body)["messages"] == messages  # original bytes
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        assert "disk is full" in (await response.json())["problems"]["state_db_writes"]
    assert proxy.state.sessions.get("ses_full").tally.fail_opens == 1

    db.execute("PRAGMA max_page_count = 1073741823")  # the disk has room again
    await _post(client, proxy, messages, session="ses_full")
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    keys = [key for m in sent for key in marker_keys(m.get("content") or "")]
    assert keys, "the session is compressed again once the disk has room"
    committed = OriginalStore(open_database(proxy.state.settings.data_dir / DB_NAME))
    for key in keys:
        assert committed.get(key) is not None  # every marker sent has its original committed
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 200
