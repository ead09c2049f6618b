"""Compaction through the running proxy: checkpoints on disk, the summarizer's prompt, resume."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from compressors.markers import marker_keys
from memory.archive import CHECKPOINT_FILE, LOG_FILE, RAW_FILE
from memory.ccr import OriginalStore
from memory.checkpoint import Checkpoint
from memory.db import DB_NAME, open_database
from memory.injection import TAG
from proxy import compaction as compaction_module
from tests.conftest import CAPTURES, CORPUS
from tests.test_memory_injection import make_project, system_prompt
from tests.test_proxy_compression import session_messages

COMPACTION = json.loads(
    (CAPTURES / "opencode-1.18.33-openai-compatible-compaction.json").read_text()
)
AGENT = json.loads(
    (CAPTURES / "opencode-1.18.33-openai-compatible-agent-with-tool-results.json").read_text()
)
SUMMARIZER = COMPACTION["body"]["messages"][0]["content"]
COMPACTION_TAIL = COMPACTION["body"]["messages"][1]["content"].split("</conversation>", 1)[1]


async def send(
    client, proxy, path: str, body: dict[str, Any], session: str, **headers: str
) -> None:
    headers = {"x-session-id": session, **{k.replace("_", "-"): v for k, v in headers.items()}}
    async with client.post(proxy.url + path, data=orjson.dumps(body), headers=headers) as response:
        assert response.status == 200, await response.text()
        await response.read()


async def written(proxy) -> None:
    """Wait for the checkpoints the proxy writes in the background (``MemoryCatalog.writes``):
    a compaction's answer does not wait for them."""
    assert await asyncio.to_thread(proxy.state.memory.catalog.writes.drain, 10.0)


def checkpoint_on_disk_when_forwarded(upstream, project: Path) -> list[bool]:
    """Make the fake upstream note, for each request it receives, whether the project's
    checkpoint is on disk then; the list it fills."""
    from aiohttp import web

    from tests.fake_upstream import json_answer

    checkpoint = project / ".deep-memory" / CHECKPOINT_FILE
    seen: list[bool] = []

    async def provider(request: web.Request, body: bytes) -> web.StreamResponse:
        seen.append(checkpoint.exists())
        return web.json_response(json_answer(request.path, "ok"))

    upstream.handler = provider
    return seen


def hold_checkpoint_writes(monkeypatch) -> threading.Event:
    """Make every checkpoint write wait until the event returned is set (at most 10 s)."""
    release = threading.Event()
    real_write = compaction_module.write_checkpoint

    def held_write(*args, **kwargs):
        assert release.wait(10)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(compaction_module, "write_checkpoint", held_write)
    return release


def transcript_of(messages: list[dict[str, Any]]) -> str:
    """OpenCode's compaction transcript format, rendered from chat messages."""
    lines = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "user":
            lines.append(f"[User]: {content}\n\n")
        elif role == "assistant":
            for call in message.get("tool_calls") or ():
                function = call["function"]
                lines.append(f"[Assistant tool call]: {function['name']}({function['arguments']})")
            if content:
                lines.append(f"[Assistant]: {content}\n")
        elif role == "tool":
            lines.append(f"[Tool result]: {content}\n")
    return "\n".join(lines)


def compaction_body(transcript: str) -> dict[str, Any]:
    return {
        "model": "m",
        "stream": True,
        "messages": [
            {"role": "system", "content": SUMMARIZER},
            {
                "role": "user",
                "content": "Here is the conversation so far:\n\n<conversation>\n"
                + transcript
                + "\n</conversation>"
                + COMPACTION_TAIL,
            },
        ],
    }


def agent_body(project: Path) -> dict[str, Any]:
    body = copy.deepcopy(AGENT["body"])
    for message in body["messages"]:
        if isinstance(message.get("content"), str):
            message["content"] = message["content"].replace("/home/dev/demo-repo", str(project))
    return body


async def test_the_opencode_compaction_writes_the_checkpoint(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    agent = agent_body(project)
    await send(client, proxy, "/v1/chat/completions", agent, "ses_c")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_c")
    await written(proxy)

    memory_dir = project / ".deep-memory"
    raw = orjson.loads((memory_dir / RAW_FILE).read_bytes())
    assert raw["sessionID"] == "ses_c" and raw["messages"] == agent["messages"]
    assert raw["messageCount"] == len(agent["messages"])
    checkpoint = Checkpoint.parse((memory_dir / CHECKPOINT_FILE).read_text())
    assert checkpoint.session_id == "ses_c"
    assert checkpoint.intents[0].startswith("List the files in this repo")
    assert any("README.md" in path for path, _ in checkpoint.files_read)
    [line] = (memory_dir / LOG_FILE).read_text().splitlines()
    assert orjson.loads(line)["source"] == "proxy"
    assert len(list((memory_dir / "sessions" / "ses_c").glob("checkpoint-*"))) == 2

    sent = orjson.loads(upstream.requests[-1].body)
    system = sent["messages"][0]["content"]
    assert system.startswith(SUMMARIZER) and f'<{TAG} kind="handoff">' in system
    assert str(memory_dir / "sessions" / "ses_c") in system
    assert sent["messages"][1] == COMPACTION["body"]["messages"][1]  # the transcript as sent

    proxy.state.stores.originals  # noqa: B018 - the proxy stays up for the lookups below
    async with client.get(f"{proxy.url}/sessions/ses_c/messages/1") as response:
        assert (await response.json())["message"] == agent["messages"][1]
    async with client.get(f"{proxy.url}/sessions/ses_c/checkpoint") as response:
        assert (await response.text()).startswith("# Checkpoint — ses_c")
    async with client.get(f"{proxy.url}/sessions/ses_c/messages/99") as response:
        assert response.status == 404


@pytest.mark.parametrize("mode", ["off", "replace"])
async def test_prompt_modes(start_proxy, upstream, client, tmp_path, mode):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"], allowed_roots=str(home), compaction_prompt=mode
    )
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_m")
    body = orjson.dumps(COMPACTION["body"])
    async with client.post(
        proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": "ses_m"}
    ) as response:
        await response.read()
    sent = upstream.requests[-1].body
    await written(proxy)
    assert (project / ".deep-memory" / CHECKPOINT_FILE).exists()
    if mode == "off":
        assert sent == body
        return
    user = orjson.loads(sent)["messages"][1]["content"]
    conversation = COMPACTION["body"]["messages"][1]["content"].split("</conversation>")[0]
    assert user.startswith(conversation + "</conversation>")
    assert "## Task Overview" in user and "## Critical Context" in user and "<template>" not in user
    assert str(project / ".deep-memory" / "sessions" / "ses_m") in user


def chinese_session(project: Path) -> list[dict[str, Any]]:
    def call(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": function}],
        }

    return [
        {"role": "system", "content": system_prompt(project)},
        {"role": "user", "content": "修复登录接口的时区问题。必须保持接口名称不变。"},
        call("c1", "bash", {"command": "pytest tests/test_login.py"}),
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": "FAILED tests/test_login.py::test_tz\n"
            "E   AssertionError: 时区错误\n1 failed",
        },
        call(
            "c2",
            "edit",
            {"filePath": f"{project}/app/login.py", "oldString": "a", "newString": "b"},
        ),
        {"role": "tool", "tool_call_id": "c2", "content": "Edit applied successfully."},
        {"role": "assistant", "content": "问题出在时区转换上。我们决定统一使用 UTC 存储时间。"},
        {"role": "user", "content": "好的，继续"},
    ]


async def test_chinese_session_in_the_anthropic_format(start_proxy, upstream, client, tmp_path):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    chat = chinese_session(project)
    await send(
        client,
        proxy,
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": chat,
            "tools": [{"type": "function", "function": {"name": "bash"}}],
        },
        "ses_zh",
    )
    compaction = compaction_body(transcript_of(chat[1:]))
    anthropic = {
        "model": "m",
        "max_tokens": 4096,
        "system": [{"type": "text", "text": SUMMARIZER}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": compaction["messages"][1]["content"]}],
            }
        ],
    }
    await send(client, proxy, "/v1/messages", anthropic, "ses_zh")
    await written(proxy)
    checkpoint = Checkpoint.parse((project / ".deep-memory" / CHECKPOINT_FILE).read_text())
    assert checkpoint.intents[0].startswith("修复登录接口的时区问题")
    assert any("UTC" in decision for decision in checkpoint.decisions)
    assert any("接口名称不变" in constraint for constraint in checkpoint.constraints)
    assert any("login.py" in change for change in checkpoint.file_changes)
    assert any("时区错误" in gotcha for gotcha in checkpoint.gotchas)
    sent = orjson.loads(upstream.requests[-1].body)
    assert sent["system"][0] == anthropic["system"][0]
    assert sent["system"][1]["text"].startswith(f'<{TAG} kind="handoff">')


async def test_a_compaction_the_proxy_did_not_see_coming_uses_the_transcript(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"], allowed_roots=str(home), project_dir=str(project)
    )
    chat = chinese_session(project)
    responses = {
        "model": "m",
        "instructions": SUMMARIZER,
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": compaction_body(transcript_of(chat[1:]))["messages"][1]["content"],
                    }
                ],
            }
        ],
    }
    await send(client, proxy, "/v1/responses", responses, "ses_new")
    await written(proxy)
    memory_dir = project / ".deep-memory"
    assert (
        orjson.loads((memory_dir / LOG_FILE).read_text().splitlines()[0])["source"] == "transcript"
    )
    checkpoint = Checkpoint.parse((memory_dir / CHECKPOINT_FILE).read_text())
    assert any("login.py" in change for change in checkpoint.file_changes)
    assert orjson.loads(upstream.requests[-1].body)["instructions"].startswith(SUMMARIZER + "\n\n<")
    # The history kept is the request as it came, not as the stage rewrote it meanwhile.
    raw = orjson.loads((memory_dir / RAW_FILE).read_bytes())
    assert raw["messages"] == [{"role": "system", "content": SUMMARIZER}, *responses["input"]]


def long_transcript() -> dict[str, Any]:
    path = CORPUS / "swesmith-moto-pr6055.json"
    if not path.exists():
        pytest.skip("the shared corpus is not next to this clone")
    return orjson.loads(path.read_bytes())


async def test_corpus_session_compacted_in_the_middle_resumes(
    start_proxy, upstream, client, tmp_path
):
    data = long_transcript()
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    messages = copy.deepcopy(data["messages"])
    messages[0] = {
        "role": "system",
        "content": system_prompt(project) + "\n" + messages[0]["content"],
    }
    half = [k for k, m in enumerate(messages) if m["role"] == "assistant"][len(messages) // 4]
    tools = data.get("tools") or [{"type": "function", "function": {"name": "bash"}}]
    for k in [k for k, m in enumerate(messages[:half]) if m["role"] == "assistant"] + [half]:
        await send(
            client,
            proxy,
            "/v1/chat/completions",
            {"model": "m", "messages": messages[:k], "tools": tools},
            "ses_long",
        )
    seen = messages[:half]
    compaction = compaction_body(transcript_of(seen[1:]))
    await send(client, proxy, "/v1/chat/completions", compaction, "ses_long")
    await written(proxy)

    memory_dir = project / ".deep-memory"
    raw = orjson.loads((memory_dir / RAW_FILE).read_bytes())
    assert raw["messages"] == seen  # every original, none of the compressed forms
    sent_compaction = orjson.loads(upstream.requests[-1].body)["messages"][1]["content"]
    assert len(sent_compaction) < len(compaction["messages"][1]["content"])  # results compressed
    keys = marker_keys(sent_compaction)
    assert keys
    for key in keys:  # every shortened result of the transcript is still there in full
        async with client.get(f"{proxy.url}/expand/ccr:{key}") as response:
            assert response.status == 200
            assert (await response.text()) in compaction["messages"][1]["content"]

    restarted = [
        messages[0],
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": "## Objective\n- Fix the moto bug\n"},
        {"role": "user", "content": "Continue if you have next steps"},
    ]
    body = {"model": "m", "messages": restarted, "tools": tools}
    await send(client, proxy, "/v1/chat/completions", body, "ses_long")
    first = orjson.loads(upstream.requests[-1].body)["messages"]
    # The restarted history opens with "What did we do so far?": the checkpoint goes there.
    resume = first[1]["content"]
    assert resume.startswith("What did we do so far?")
    assert 'kind="resume"' not in first[3]["content"]
    assert f'<{TAG} kind="resume">' in resume and "This conversation was compacted" in resume
    assert str(memory_dir / "sessions" / "ses_long") in resume
    restarted += [
        {"role": "assistant", "content": "Looking."},
        {"role": "user", "content": "go on"},
    ]
    await send(client, proxy, "/v1/chat/completions", {**body, "messages": restarted}, "ses_long")
    later = orjson.loads(upstream.requests[-1].body)["messages"]
    assert later[1]["content"] == resume  # memoised, byte for byte
    assert 'kind="resume"' not in later[-1]["content"]

    # The next session in the project starts with the checkpoint of this one.
    fresh = [messages[0], {"role": "user", "content": "Let's continue with the moto fix"}]
    await send(
        client,
        proxy,
        "/v1/chat/completions",
        {"model": "m", "messages": fresh, "tools": tools},
        "ses_next",
    )
    opening = orjson.loads(upstream.requests[-1].body)["messages"][1]["content"]
    assert "earlier session in this project (ses_long" in opening

    # A subagent's first message gets no resume block: its parent has the context.
    task = {"model": "m", "messages": fresh, "tools": tools}
    await send(
        client, proxy, "/v1/chat/completions", task, "ses_sub", x_parent_session_id="ses_next"
    )
    assert 'kind="resume"' not in orjson.loads(upstream.requests[-1].body)["messages"][1]["content"]

    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    long_session = next(s for s in stats["sessions"] if s["session_id"] == "ses_long")
    assert long_session["memory"]["checkpoints"] == 1 and long_session["project"] == str(project)
    assert stats["totals"]["memory"]["turns"] >= 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
async def test_a_read_only_memory_dir_never_blocks_the_compaction(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path, None)
    memory_dir = project / ".deep-memory"
    memory_dir.mkdir()
    memory_dir.chmod(0o500)
    try:
        await _compact_and_check_health(start_proxy, upstream, client, home, project)
    finally:
        memory_dir.chmod(0o700)


async def test_an_unusable_memory_dir_never_blocks_the_compaction(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path, None)
    (project / ".deep-memory").write_text("a file where the directory should be")
    await _compact_and_check_health(start_proxy, upstream, client, home, project)


async def test_a_full_disk_never_blocks_the_compaction(
    start_proxy, upstream, client, tmp_path, monkeypatch
):
    home, project = make_project(tmp_path, None)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("proxy.compaction.write_checkpoint", disk_full)
    await _compact_and_check_health(
        start_proxy, upstream, client, home, project, archive_named=True
    )


async def _compact_and_check_health(
    start_proxy, upstream, client, home, project, archive_named: bool = False
):
    """The compaction goes upstream all the same, and /health says why there is no
    checkpoint. A memory dir that cannot take the session's archive is found before the
    summarizer is told of one; a write that fails later (in the background) is not."""
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_ro")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_ro")
    sent = orjson.loads(upstream.requests[-1].body)
    assert sent["messages"][1] == COMPACTION["body"]["messages"][1]
    named = "keeps the full history" in sent["messages"][0]["content"]
    assert named == archive_named
    await written(proxy)
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 503
        problems = (await response.json())["problems"]
    assert "cannot write" in problems["checkpoint_writes"]
    assert proxy.state.sessions.get("ses_ro").tally.fail_opens == 0


def test_history_cache_is_bounded_in_sessions_and_bytes():
    from compressors.view import Dialect
    from memory.in_process import LocalHistories

    cache = LocalHistories(max_sessions=3, max_bytes=1000)
    for n in range(5):
        cache.remember(f"s{n}", Dialect.OPENAI_CHAT, b"x" * 100)
    assert [cache.get(f"s{n}") is not None for n in range(5)] == [False, False, True, True, True]
    cache.remember("big", Dialect.ANTHROPIC, b"y" * 900)
    assert cache.get("big") == (Dialect.ANTHROPIC, b"y" * 900)
    assert sum(cache.get(f"s{n}") is not None for n in range(5)) == 1  # 900 + 100 <= 1000
    cache.remember("huge", Dialect.ANTHROPIC, b"z" * 2000)  # larger than the whole cache
    assert cache.get("huge") is None and cache.get("big") is not None


async def test_no_transcript_marker_goes_upstream_before_its_original_is_committed(
    start_proxy, upstream, client, monkeypatch
):
    monkeypatch.setattr("memory.db.BUSY_TIMEOUT_SECONDS", 0.05)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"])
    body = compaction_body(transcript_of(session_messages(4)[1:]))
    path = proxy.state.settings.data_dir / DB_NAME
    locker = open_database(path)
    locker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock
    await send(client, proxy, "/v1/chat/completions", body, "ses_locked")
    assert upstream.requests[-1].body == orjson.dumps(body)  # the original bytes
    async with client.get(proxy.url + "/health") as response:
        assert "database is locked" in (await response.json())["problems"]["state_db_writes"]
    locker.execute("ROLLBACK")

    await send(client, proxy, "/v1/chat/completions", body, "ses_locked")  # the resend
    keys = marker_keys(orjson.loads(upstream.requests[-1].body)["messages"][1]["content"])
    assert keys
    committed = OriginalStore(open_database(path))
    for key in keys:
        original = committed.get(key)
        assert original is not None and original.decode() in body["messages"][1]["content"]
    async with client.get(proxy.url + "/health") as response:
        assert response.status == 200


async def test_a_refused_projects_compaction_keeps_nothing(start_proxy, upstream, client, tmp_path):
    home, _ = make_project(tmp_path, None)
    outside = tmp_path / "elsewhere" / "proj"
    outside.mkdir(parents=True)
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"], allowed_roots=str(home), data_dir=str(tmp_path / "data")
    )
    await send(client, proxy, "/v1/chat/completions", agent_body(outside), "ses_out")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_out")
    assert list(outside.iterdir()) == []
    global_dir = tmp_path / "data" / "memory"
    assert not global_dir.exists() or not any(global_dir.rglob("*checkpoint*"))
    sent = orjson.loads(upstream.requests[-1].body)
    assert sent["messages"][1] == COMPACTION["body"]["messages"][1]  # forwarded all the same


async def test_the_compaction_goes_upstream_while_its_checkpoint_is_written(
    start_proxy, upstream, client, tmp_path, monkeypatch
):
    """Issue 16: the checkpoint (extraction and writes: tens of ms, up to a hundred on a long
    session) was written before the compaction went upstream. It is written in the background
    now: the compaction and its answer do not wait for it; the session's next request, which
    may read it, does; and the statistics count it once written."""
    home, project = make_project(tmp_path, None)
    checkpoint = project / ".deep-memory" / CHECKPOINT_FILE
    on_disk_when_forwarded = checkpoint_on_disk_when_forwarded(upstream, project)
    release = hold_checkpoint_writes(monkeypatch)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_order")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_order")
    assert on_disk_when_forwarded == [False, False] and not checkpoint.exists()
    sent = orjson.loads(upstream.requests[-1].body)["messages"][0]["content"]
    assert str(project / ".deep-memory" / "sessions" / "ses_order") in sent  # named already

    following = asyncio.create_task(
        send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_order")
    )
    await asyncio.sleep(0.3)
    assert not following.done() and len(on_disk_when_forwarded) == 2  # it waits for the write
    release.set()
    await asyncio.wait_for(following, 10)
    assert on_disk_when_forwarded == [False, False, True]
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    [session] = [s for s in stats["sessions"] if s["session_id"] == "ses_order"]
    assert session["memory"]["checkpoints"] == 1


async def test_a_compaction_that_fails_open_still_writes_its_checkpoint(
    start_proxy, upstream, client, tmp_path
):
    """An addon after the compaction stage fails: the original bytes go upstream, and the
    checkpoint the stage began is written all the same (as it was when it came first)."""
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))

    class Broken:
        def request(self, conversation, flow) -> bool:
            raise RuntimeError("a bug in a later addon")

    proxy.state.addons.append(Broken())
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_fail")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_fail")
    assert upstream.requests[-1].body == orjson.dumps(COMPACTION["body"])
    await written(proxy)
    checkpoint = Checkpoint.parse((project / ".deep-memory" / CHECKPOINT_FILE).read_text())
    assert checkpoint.session_id == "ses_fail"


async def test_a_compaction_that_fails_open_makes_the_next_request_wait_for_its_checkpoint(
    start_proxy, upstream, client, tmp_path, monkeypatch
):
    """The checkpoint an addon began before a later one failed is waited for as it would have
    been: the session's next request, whose resume block reads it, comes after it."""
    home, project = make_project(tmp_path, None)
    on_disk_when_forwarded = checkpoint_on_disk_when_forwarded(upstream, project)
    release = hold_checkpoint_writes(monkeypatch)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))

    class BrokenOnCompactions:
        def request(self, conversation, flow) -> bool:
            if flow.kind.value == "compaction":
                raise RuntimeError("a bug in a later addon")
            return False

    proxy.state.addons.append(BrokenOnCompactions())
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_late")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_late")
    assert upstream.requests[-1].body == orjson.dumps(COMPACTION["body"])  # failed open
    following = asyncio.create_task(
        send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_late")
    )
    await asyncio.sleep(0.3)
    assert not following.done() and on_disk_when_forwarded == [False, False]
    release.set()
    await asyncio.wait_for(following, 10)
    assert on_disk_when_forwarded == [False, False, True]


async def test_stopping_the_proxy_waits_for_the_checkpoints_being_written(tmp_path):
    """A checkpoint begun in the background is written before the proxy stops."""
    from memory.catalog import MemoryCatalog

    catalog = MemoryCatalog(tmp_path / "data")
    started, release, done = threading.Event(), threading.Event(), []

    def slow() -> None:
        started.set()
        release.wait(10)
        done.append(True)

    catalog.writes.submit(slow)
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    catalog.close()
    assert done == [True]
    with pytest.raises(RuntimeError):
        catalog.writes.submit(lambda: None)


async def test_a_compaction_whose_history_cannot_be_read_keeps_its_checkpoint(
    start_proxy, upstream, client, tmp_path
):
    """With a shared state backend away, the session's last request cannot be read: the
    checkpoint comes from the compaction's own transcript, and the request is still handled."""
    from memory.state import StateUnavailable
    from proxy.compaction import CompactionStage

    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    [compaction] = [a for a in proxy.state.addons if isinstance(a, CompactionStage)]

    class Away:
        def remember(self, session_id, dialect, raw) -> None:
            pass

        def get(self, session_id):
            raise StateUnavailable("cannot read the last request of session ses_h on redis://h/0")

    compaction.histories = Away()
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_h")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_h")
    await written(proxy)
    memory_dir = project / ".deep-memory"
    [line] = (memory_dir / LOG_FILE).read_text().splitlines()
    assert orjson.loads(line)["source"] == "transcript"
    assert Checkpoint.parse((memory_dir / CHECKPOINT_FILE).read_text()).session_id == "ses_h"
    assert proxy.state.sessions.get("ses_h").tally.fail_opens == 0


async def test_the_index_takes_a_new_checkpoint_in_once_the_answer_is_out(
    start_proxy, upstream, client, tmp_path, monkeypatch
):
    """Issue 16: the search index caught a new checkpoint (and a captured note) up only at
    the next search, on the path of the session's next user message (a rebuild and the new
    entries' embeddings: tens of milliseconds). The compaction's deferred work does it."""
    from memory.catalog import ProjectMemory

    refreshed: list[Path | None] = []
    refresh_index = ProjectMemory.refresh_index

    def counted(self: ProjectMemory) -> None:
        refresh_index(self)
        refreshed.append(self.project_dir)

    monkeypatch.setattr(ProjectMemory, "refresh_index", counted)
    home, project = make_project(tmp_path, None)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_i")
    await send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_i")
    for _ in range(500):
        if project in refreshed:
            break
        await asyncio.sleep(0.01)
    assert project in refreshed
    memory = proxy.state.memory.catalog.get(project)
    archived = list((project / ".deep-memory" / "sessions" / "ses_i").glob("checkpoint-*"))
    assert any(path in memory.index.paths for path in archived)
    with memory.index_lock:
        assert memory.index.refresh() is False  # nothing left for the next search to do
