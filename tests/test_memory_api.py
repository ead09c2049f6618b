"""The memory tools (MCP) and ``/memory/...`` (HTTP) on a running proxy."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.test_memory_injection import TOOLS, make_project, system_prompt

JSON_TYPE = {"Content-Type": "application/json"}


async def call_tool(client, proxy, name, arguments, query=""):
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }
    async with client.post(f"{proxy.url}/mcp{query}", json=message) as response:
        assert response.status == 200
        result = (await response.json())["result"]
    return result["content"][0]["text"], result["isError"]


async def chat(client, proxy, project: Path, session_id: str, text: str = "hello"):
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": system_prompt(project)},
            {"role": "user", "content": text},
        ],
        "tools": TOOLS,
    }
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=orjson.dumps(body),
        headers={"x-session-id": session_id},
    ) as response:
        await response.read()


async def test_mcp_store_search_forget(start_proxy, upstream, client, tmp_path):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    where = f"?project={project}"
    text, error = await call_tool(
        client,
        proxy,
        "memory_store",
        {"section": "Decisions", "text": "Use uv to manage the virtualenv"},
        where,
    )
    assert not error and text.startswith("Stored [") and str(project) in text
    assert "Use uv to manage" in (project / ".deep-memory" / "MEMORY.md").read_text()

    text, error = await call_tool(
        client,
        proxy,
        "memory_store",
        {"section": "decisions", "text": "use uv to manage the virtualenv."},
        where,
    )
    assert not error and text.startswith("Not stored: exact duplicate")
    await call_tool(
        client, proxy, "memory_store", {"section": "Gotchas", "text": "缓存目录必须先清理"}, where
    )

    text, error = await call_tool(client, proxy, "memory_search", {"query": "缓存 清理"}, where)
    assert not error and text.index("缓存目录必须先清理") < len(text)
    assert "virtualenv" not in text

    text, error = await call_tool(client, proxy, "memory_forget", {"query": "virtualenv"}, where)
    assert not error and text.startswith("Preview: 1 entry would be removed")
    assert "Use uv" in (project / ".deep-memory" / "MEMORY.md").read_text()
    entry_id = text.split("- [", 1)[1].split("]", 1)[0]

    text, error = await call_tool(
        client, proxy, "memory_forget", {"query": "virtualenv", "confirm": True}, where
    )
    assert error and "ids the preview listed" in text
    text, error = await call_tool(
        client, proxy, "memory_forget", {"ids": [entry_id], "confirm": True}, where
    )
    assert not error and text.startswith("Removed 1")
    assert "Use uv" not in (project / ".deep-memory" / "MEMORY.md").read_text()


async def test_mcp_project_choice_is_never_a_guess(start_proxy, upstream, client, tmp_path):
    home, first = make_project(tmp_path, None)
    second = home / "work" / "other"
    second.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    store = {"section": "Facts", "text": "The API listens on port 9000"}

    text, error = await call_tool(client, proxy, "memory_store", store)
    assert not error and "no project (global memory)" in text

    await chat(client, proxy, first, "ses_1")
    text, error = await call_tool(client, proxy, "memory_search", {"query": "port"})
    assert not error and "chosen by active session" in text and str(first) in text

    await chat(client, proxy, second, "ses_2")
    text, error = await call_tool(client, proxy, "memory_store", store)
    assert error and "several projects" in text and str(first) in text and str(second) in text

    text, error = await call_tool(client, proxy, "memory_store", {**store, "project": str(second)})
    assert not error and "chosen by argument" in text
    assert (second / ".deep-memory" / "MEMORY.md").exists()
    assert not (first / ".deep-memory").exists()

    text, error = await call_tool(client, proxy, "memory_store", {**store, "project": str(outside)})
    assert error and "not under an allowed root" in text
    assert list(outside.iterdir()) == []

    text, error = await call_tool(client, proxy, "memory_store", store, f"?project={first}")
    assert not error and "chosen by endpoint" in text


async def test_stored_memory_reaches_the_next_user_message(start_proxy, upstream, client, tmp_path):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    await chat(client, proxy, project, "ses_1", "set up the build")
    await call_tool(
        client,
        proxy,
        "memory_store",
        {"section": "Gotchas", "text": "The build needs GNU make 4.3, not BSD make"},
    )
    await chat(client, proxy, project, "ses_2", "why does the build fail with make?")
    user = orjson.loads(upstream.requests[-1].body)["messages"][1]["content"]
    assert "GNU make 4.3" in user


async def test_http_memory_endpoints(start_proxy, upstream, client, tmp_path):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    base = f"{proxy.url}/memory"
    headers = {"X-Deep-Memory-Project": str(project)}

    async def call(method, op, status=200, **kwargs):
        kwargs.setdefault("headers", headers)
        async with client.request(method, f"{base}/{op}", **kwargs) as response:
            assert response.status == status, await response.text()
            if response.content_type == "application/json":
                return await response.json()
            return await response.text()

    stored = await call("POST", "store", json={"section": "Facts", "text": "Staging is eu-west-1"})
    assert stored["stored"] and stored["project"] == str(project)
    assert stored["chosen_by"] == "endpoint"
    dup = await call("POST", "store", json={"section": "Facts", "text": "staging is eu-west-1"})
    assert dup["stored"] is False and "duplicate" in dup["reason"]
    found = await call("GET", "search", params={"q": "staging region"})
    assert found["results"][0]["text"] == "Staging is eu-west-1"
    assert found["results"][0]["section"] == "Facts" and found["results"][0]["line"] > 0
    listed = await call("GET", "list", params={"section": "facts"})
    assert [e["text"] for e in listed["entries"]] == ["Staging is eu-west-1"]
    stats = await call("GET", "stats")
    assert stats["entries"] == 1 and stats["sections"]["Facts"] == 1
    exported = await call("GET", "export", params={"format": "json"})
    markdown = await call("GET", "export", params={"format": "markdown"})
    assert "## Facts" in markdown and "- Staging is eu-west-1 [" in markdown

    other = home / "work" / "copy"
    other.mkdir()
    imported = await call(
        "POST",
        "import",
        data=orjson.dumps(exported),
        headers={"X-Deep-Memory-Project": str(other), "Content-Type": "application/json"},
    )
    assert imported["added"] == 1 and imported["duplicates"] == 0
    again = await call(
        "POST",
        "import",
        params={"project": str(other)},
        data=markdown,
        headers={"Content-Type": "text/markdown; charset=utf-8"},
    )
    assert again["added"] == 0 and again["duplicates"] == 1

    preview = await call("POST", "cleanup", json={"section": "Facts"})
    assert preview["dry_run"] and len(preview["matched"]) == 1 and not preview["removed"]
    removed = await call("POST", "cleanup", json={"section": "Facts", "dry_run": False})
    assert removed["removed"] and (await call("GET", "stats"))["entries"] == 0

    forget = await call("POST", "forget", json={"query": "nothing like it"})
    assert forget["matched"] == [] and forget["removed"] is False

    assert (
        "unknown section"
        in (await call("GET", "list", 400, params={"section": "x"}))["error"]["message"]
    )
    await call("POST", "store", 400, data=b"{not json", headers={**headers, **JSON_TYPE})
    await call("GET", "store", 405)
    await call("GET", "nope", 404)
    refused = await call("GET", "stats", 400, params={"project": str(tmp_path)})
    assert "not under an allowed root" in refused["error"]["message"]


async def test_malformed_import_and_message_number_are_clear_400s(
    start_proxy, upstream, client, tmp_path
):
    """Were 500s: a RecursionError from the import parser, a ValueError from int('²')."""
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    headers = {"X-Deep-Memory-Project": str(project), "Content-Type": "application/json"}
    for nested in (b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000):
        async with client.post(
            f"{proxy.url}/memory/import", data=nested, headers=headers
        ) as response:
            assert response.status == 400
            assert "nests too deeply" in (await response.json())["error"]["message"]
    # unicode digits: str.isdigit() is true, int() may refuse; int() refuses 5,000 digits
    for number in ("²", "٣", "１", "9" * 5000):
        async with client.get(
            f"{proxy.url}/sessions/ses_x/messages/{number}", headers=headers
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
            assert error["code"] == "bad_index" and "0 or more" in error["message"]


async def test_memory_import_reads_a_gzip_body(start_proxy, upstream, client, tmp_path):
    """The server leaves request bodies compressed (relays forward them as received), so the
    memory endpoints decode gzip themselves."""
    import gzip

    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    headers = {
        "X-Deep-Memory-Project": str(project),
        "Content-Encoding": "gzip",
        "Content-Type": "application/json",
    }
    export = orjson.dumps({"entries": [{"section": "Facts", "text": "Builds run on Fridays"}]})
    async with client.post(
        f"{proxy.url}/memory/import", data=gzip.compress(export), headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["added"] == 1
    async with client.post(
        f"{proxy.url}/memory/store", data=b"not gzip", headers=headers
    ) as response:
        assert response.status == 400
        assert "not valid gzip" in (await response.json())["error"]["message"]
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with client.post(
        f"{proxy.url}/mcp", data=gzip.compress(orjson.dumps(message)), headers=headers
    ) as response:
        assert response.status == 200
        assert (await response.json())["result"]["tools"]
