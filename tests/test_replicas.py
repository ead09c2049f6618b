"""Several replicas behind a balancer that does not pin sessions, sharing a real Redis server:
the same bytes as one process, every key expands on every replica, fail open while Redis is
away, back without a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from compressors.markers import marker_keys
from memory.archive import CHECKPOINT_FILE
from tests.conftest import REDIS_PASSWORD as PASSWORD
from tests.redis_server import RedisServer
from tests.test_durability import health, post, request_body, sent_keys, tool_outputs

SESSIONS = ("ses_replica_a", "ses_replica_b")
STEPS = range(3, 11)


async def replicas(start_proxy, upstream, tmp_path: Path, redis: RedisServer, n: int = 3):
    return [
        await start_proxy(
            upstream=[f"{upstream.url}/v1"],
            data_dir=str(tmp_path / f"replica{k}"),
            state_url=redis.url,
            replica_name=f"replica{k}",
        )
        for k in range(n)
    ]


def forwarded(upstream) -> list[bytes]:
    return [request.body for request in upstream.requests]


def markers_in_last(upstream) -> list[str]:
    messages = orjson.loads(upstream.requests[-1].body)["messages"]
    return [key for m in messages for key in marker_keys(m.get("content") or "")]


async def test_round_robin_replicas_forward_what_one_process_forwards(
    start_proxy, upstream, client, tmp_path, redis
):
    alone = await start_proxy(upstream=[f"{upstream.url}/v1"], data_dir=str(tmp_path / "alone"))
    for session in SESSIONS:
        for steps in STEPS:
            await post(client, alone, request_body(steps), session)
    reference = forwarded(upstream)
    upstream.requests.clear()

    group = await replicas(start_proxy, upstream, tmp_path, redis)
    turn = 0
    for session in SESSIONS:
        for steps in STEPS:  # round robin, the sessions' requests spread over every replica
            await post(client, group[turn % len(group)], request_body(steps), session)
            turn += 1
    assert forwarded(upstream) == reference
    keys = set(sent_keys(upstream))
    assert keys, "the sessions were compressed"

    originals = tool_outputs(STEPS[-1])
    for replica in group:  # a key one replica compressed expands on every other
        for key in sorted(keys):
            async with client.get(f"{replica.url}/expand/ccr:{key}") as response:
                assert response.status == 200
                assert await response.read() == originals[key].encode()
    status, report = await health(client, group[0])
    assert status == 200 and report["state"] == f"redis://<redacted>@127.0.0.1:{redis.port}/0"
    assert PASSWORD not in orjson.dumps(report).decode()


async def test_without_redis_requests_go_through_unchanged_and_come_back_after(
    start_proxy, upstream, client, tmp_path, redis
):
    group = await replicas(start_proxy, upstream, tmp_path, redis, n=2)
    session = SESSIONS[0]
    for steps in (3, 4):
        await post(client, group[steps % 2], request_body(steps), session)
    assert markers_in_last(upstream)

    redis.stop()
    for steps in (5, 6):
        body = request_body(steps)
        await post(client, group[steps % 2], body, session)
        assert upstream.requests[-1].body == body  # fail open: the client's bytes
        status, report = await health(client, group[steps % 2])
        assert status == 503 and "127.0.0.1" in report["problems"]["state_db_writes"]
        assert PASSWORD not in orjson.dumps(report).decode()

    redis.start()  # the same port, empty: what was decided before is gone with it
    await asyncio.sleep(2.1)  # a replica that found it away waits a moment before trying
    body = request_body(7)
    await post(client, group[1], body, session)
    assert upstream.requests[-1].body != body  # compressed again, without a restart
    await post(client, group[0], request_body(8), session)
    assert markers_in_last(upstream)
    status, report = await health(client, group[1])
    assert status == 200, report


async def test_a_replica_started_before_redis_works_once_it_answers(
    start_proxy, upstream, client, tmp_path, redis
):
    redis.stop()
    (replica,) = await replicas(start_proxy, upstream, tmp_path, redis, n=1)
    body = request_body(4)
    await post(client, replica, body, SESSIONS[1])
    assert upstream.requests[-1].body == body
    status, report = await health(client, replica)
    assert status == 503 and set(report["problems"]) & {"state_server", "state_db_writes"}
    redis.start()
    await asyncio.sleep(2.1)
    await post(client, replica, request_body(5), SESSIONS[1])
    assert markers_in_last(upstream)


def test_expand_on_the_command_line_reads_the_shared_state(tmp_path: Path, redis, capsys):
    from compressors.markers import ccr_key
    from memory.redis_state import RedisOriginals, RedisState
    from proxy.cli import main

    state = RedisState(redis.url)
    original = "line one\nline two\n"
    RedisOriginals(state).put_many({ccr_key(original): original})
    state.close()
    code = main(
        [
            "expand",
            f"ccr:{ccr_key(original)}",
            "--state-url",
            redis.url,
            "--data-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out == original


async def test_replicas_racing_on_the_same_request_forward_one_form(
    start_proxy, upstream, client, tmp_path, redis
):
    group = await replicas(start_proxy, upstream, tmp_path, redis, n=2)
    session = "ses_race"
    for steps in range(3, 9):  # each request to both replicas at once (a client's retry)
        body = request_body(steps)
        before = len(upstream.requests)
        await asyncio.gather(*(post(client, replica, body, session) for replica in group))
        first, second = (request.body for request in upstream.requests[before:])
        assert first == second
        if steps > 3:
            assert first != body  # both compressed: the one that lost the race decided again


async def test_with_replicas_a_compaction_is_answered_once_its_checkpoint_is_written(
    start_proxy, upstream, client, tmp_path, redis, monkeypatch
):
    """A single process writes a compaction's checkpoint in the background and makes the
    session's next request wait for it; another replica cannot wait for it, and the restarted
    history's resume block reads it (the corpus replay through two replicas forwarded the
    request after the compaction otherwise than one process did). Replicas wrote it before
    forwarding (issue 16: tens of ms on the request path); now the compaction goes upstream
    at once and its answer waits for the write: the client sends the next request after it."""
    from tests.test_compaction import (
        COMPACTION,
        agent_body,
        checkpoint_on_disk_when_forwarded,
        hold_checkpoint_writes,
        send,
    )
    from tests.test_memory_injection import make_project

    home, project = make_project(tmp_path, None)
    on_disk_when_forwarded = checkpoint_on_disk_when_forwarded(upstream, project)
    release = hold_checkpoint_writes(monkeypatch)
    proxy = await start_proxy(
        upstream=[f"{upstream.url}/v1"],
        data_dir=str(tmp_path / "replica0"),
        state_url=redis.url,
        allowed_roots=str(home),
    )
    await send(client, proxy, "/v1/chat/completions", agent_body(project), "ses_held")
    compaction = asyncio.create_task(
        send(client, proxy, "/v1/chat/completions", COMPACTION["body"], "ses_held")
    )
    for _ in range(100):
        if len(on_disk_when_forwarded) == 2:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    assert on_disk_when_forwarded == [False, False]  # upstream, the checkpoint not written
    assert not compaction.done()  # and its answer held
    release.set()
    await asyncio.wait_for(compaction, 10)
    assert (project / ".deep-memory" / CHECKPOINT_FILE).exists()


async def test_a_compaction_on_another_replica_builds_the_checkpoint_from_the_session(
    start_proxy, upstream, client, tmp_path, redis
):
    from memory.archive import LOG_FILE, RAW_FILE
    from tests.test_compaction import COMPACTION, agent_body, send, written
    from tests.test_memory_injection import make_project

    home, project = make_project(tmp_path, None)
    group = [
        await start_proxy(
            upstream=[f"{upstream.url}/v1"],
            data_dir=str(tmp_path / f"replica{k}"),
            state_url=redis.url,
            allowed_roots=str(home),
            replica_name=f"replica{k}",
        )
        for k in range(2)
    ]
    agent = agent_body(project)
    await send(client, group[0], "/v1/chat/completions", agent, "ses_moved")
    await asyncio.sleep(0.2)  # its body is kept without being waited for; a compaction comes later
    await send(client, group[1], "/v1/chat/completions", COMPACTION["body"], "ses_moved")
    await written(group[1])

    memory_dir = project / ".deep-memory"  # the session's project, though B never saw it named
    raw = orjson.loads((memory_dir / RAW_FILE).read_bytes())
    assert raw["sessionID"] == "ses_moved" and raw["messages"] == agent["messages"]
    [line] = (memory_dir / LOG_FILE).read_text().splitlines()
    assert orjson.loads(line)["source"] == "proxy"  # A's request, not the transcript
    system = orjson.loads(upstream.requests[-1].body)["messages"][0]["content"]
    assert str(memory_dir / "sessions" / "ses_moved") in system

    # a memory call on B chooses the project the active session (served by both) works in
    async with client.get(f"{group[1].url}/memory/search?q=anything") as response:
        assert response.status == 200, await response.text()
        found = await response.json()
    assert found["project"] == str(project)
