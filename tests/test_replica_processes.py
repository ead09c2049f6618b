"""Real ``deepmem serve`` processes sharing a real Redis server (benchmarks.replicas starts them):
one session's requests spread round robin over two and three of them, a compaction in the middle
and one replica restarted on another port, forward byte for byte what one process forwards, and
every original expands on every replica (``/expand`` and the MCP tool ``deep_expand``)."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from benchmarks.overhead import free_port
from benchmarks.replicas import (
    Balancer,
    Replica,
    split_data_dir,
    start_replica,
    stop_replica,
    wait_ready,
)
from compressors.markers import ccr_key, marker_keys
from tests.fake_upstream import FakeUpstream
from tests.redis_server import RedisServer, redis_server_program
from tests.test_compaction import compaction_body, transcript_of
from tests.test_memory_injection import TOOLS as MEMORY_TOOLS
from tests.test_memory_injection import make_project, request_points, system_prompt
from tests.test_memory_injection import session as memory_session
from tests.test_proxy_compression import TOOLS, session_messages

SESSION = "ses_processes"
BEFORE = range(3, 8)  # agent requests before the compaction
AFTER = range(1, 6)  # and after it, on the compacted history
RESTART_AT = 3  # the request before which one replica is replaced


def agent_messages(project: Path, steps: int) -> list[dict[str, Any]]:
    messages = session_messages(steps)
    messages[0] = {"role": "system", "content": system_prompt(project)}
    return messages


def conversation(project: Path) -> list[dict[str, Any]]:
    """The bodies OpenCode sends: tool steps, the compaction (no tools, the summarizer's prompt,
    the transcript), then the agent going on from the summary with new tool steps."""
    bodies: list[dict[str, Any]] = [
        {"model": "m", "stream": True, "messages": agent_messages(project, steps), "tools": TOOLS}
        for steps in BEFORE
    ]
    bodies.append(compaction_body(transcript_of(agent_messages(project, BEFORE[-1])[1:])))
    compacted = [
        {"role": "system", "content": system_prompt(project)},
        {"role": "user", "content": "What did we do so far?"},
        {"role": "assistant", "content": "## Objective\n- Fix the parser bug\n"},
        {"role": "user", "content": "Continue if you have next steps"},
    ]
    for steps in AFTER:
        later = [
            {**m, "content": m["content"].replace("module", "later")} if m["role"] == "tool" else m
            for m in session_messages(steps)[2:]
        ]
        bodies.append({"model": "m", "stream": True, "messages": compacted + later, "tools": TOOLS})
    return bodies


def originals_of(bodies: list[dict[str, Any]]) -> dict[str, str]:
    """Every tool output the client sent, by the key a marker would name."""
    return {
        ccr_key(m["content"]): m["content"]
        for body in bodies
        for m in body["messages"]
        if m["role"] == "tool"
    }


def keys_in(body: bytes) -> set[str]:
    """The keys of the markers in a forwarded body's messages."""
    return {
        key
        for message in orjson.loads(body)["messages"]
        if isinstance(message.get("content"), str)
        for key in marker_keys(message["content"])
    }


class Cluster:
    """Replica processes of one setting; ``restart`` replaces one with a new process on a new
    port (same data dir, same state)."""

    def __init__(
        self, session: aiohttp.ClientSession, root: Path, args: list[str], state_url: str | None
    ) -> None:
        self.session, self.root, self.args, self.state_url = session, root, args, state_url
        self.replicas: list[Replica] = []

    async def start(self, k: int, port: int | None = None) -> Replica:
        replica = start_replica(
            self.root / "data",  # one host: the replicas share the data dir, as in compose
            self.state_url,
            self.args,
            self.root / f"replica{k}.log",
            port,
        )
        await wait_ready(self.session, replica)
        return replica

    async def restart(self, k: int) -> None:
        old = self.replicas[k]
        stop_replica(old)
        port = next(port for port in iter(free_port, None) if port != old.port)
        self.replicas[k] = await self.start(k, port)

    def stop(self) -> None:
        for replica in self.replicas:
            stop_replica(replica)


@asynccontextmanager
async def cluster(
    session: aiohttp.ClientSession, root: Path, args: list[str], count: int, state_url: str | None
) -> AsyncIterator[Cluster]:
    group = Cluster(session, root, args, state_url)
    try:
        for k in range(count):
            group.replicas.append(await group.start(k))
        yield group
    finally:
        group.stop()


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with session.post(
        url + "/v1/chat/completions", data=orjson.dumps(body), headers={"x-session-id": SESSION}
    ) as response:
        assert response.status == 200, await response.text()
        await response.read()


async def run_conversation(
    session: aiohttp.ClientSession,
    group: Cluster,
    bodies: list[dict[str, Any]],
    restart: Callable[[], Awaitable[None]] | None = None,
) -> None:
    for turn, body in enumerate(bodies):
        if turn == RESTART_AT and restart is not None:
            await restart()
        await post(session, group.replicas[turn % len(group.replicas)].url, body)


async def expand(session: aiohttp.ClientSession, url: str, key: str) -> bytes:
    async with session.get(f"{url}/expand/ccr:{key}") as response:
        assert response.status == 200, (url, key)
        return await response.read()


async def deep_expand(session: aiohttp.ClientSession, url: str, key: str) -> str:
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "deep_expand", "arguments": {"key": f"ccr:{key}"}},
    }
    async with session.post(
        url + "/mcp", json=message, headers={"Accept": "application/json, text/event-stream"}
    ) as response:
        assert response.status == 200
        result = (await response.json())["result"]
    assert result["isError"] is False, result
    text: str = result["content"][0]["text"]
    return text


@asynccontextmanager
async def forwarded_alone_and_by_replicas(
    client: aiohttp.ClientSession,
    upstream: FakeUpstream,
    tmp_path: Path,
    redis: RedisServer,
    count: int,
    settings: list[str],
) -> AsyncIterator[tuple[list[bytes], list[bytes], Cluster, list[dict[str, Any]]]]:
    """The conversation through one process without Redis, then round robin through ``count``
    replicas (one restarted on the way); what each forwarded, and the replicas still running."""
    home, project = make_project(tmp_path, None)
    args = ["--upstream", f"{upstream.url}/v1", "--allowed-roots", str(home)]
    args += ["--log-level", "warning", *settings]
    bodies = conversation(project)
    async with cluster(client, tmp_path / "alone", args, 1, None) as alone:  # SQLite, one process
        await run_conversation(client, alone, bodies)
    reference = [request.body for request in upstream.requests]
    upstream.requests.clear()
    if (project / ".deep-memory").exists():  # what the compaction wrote: the replicas write it
        shutil.rmtree(project / ".deep-memory")
    async with cluster(client, tmp_path / "replicas", args, count, redis.url) as group:
        await run_conversation(client, group, bodies, restart=lambda: group.restart(1))
        forwarded = [request.body for request in upstream.requests]
        yield forwarded, reference, group, bodies


def assert_same_bytes(forwarded: list[bytes], reference: list[bytes]) -> None:
    assert len(forwarded) == len(reference)
    for turn, (sent, alone_sent) in enumerate(zip(forwarded, reference, strict=True)):
        assert sent == alone_sent, f"request {turn} differs"


@pytest.mark.parametrize("count", [2, 3])
async def test_replica_processes_forward_what_one_process_forwards(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path, redis, count: int
):
    # Without checkpoints: their history comes from each process's own cache (see below).
    run = forwarded_alone_and_by_replicas(
        client, upstream, tmp_path, redis, count, ["--checkpoints", "false"]
    )
    async with run as (forwarded, reference, group, bodies):
        assert_same_bytes(forwarded, reference)
        originals = originals_of(bodies)
        keys = set().union(*map(keys_in, forwarded))
        compaction_keys = keys_in(forwarded[len(BEFORE)])
        assert keys - compaction_keys, "the agent's requests were compressed"
        assert compaction_keys, "the compaction transcript was compressed"
        assert keys <= set(originals), "every marker names a tool output the client sent"
        for replica in group.replicas:  # including the one started again
            for key in sorted(keys):
                assert await expand(client, replica.url, key) == originals[key].encode()
                assert await deep_expand(client, replica.url, key) == originals[key]


CHECKPOINT_TIME = re.compile(rb"checkpoint[- ]\d{4}-?\d\d-?\d\dT[0-9:.+]+Z?")


async def test_the_compaction_checkpoint_is_the_same_on_any_replica(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path, redis
):
    run = forwarded_alone_and_by_replicas(client, upstream, tmp_path, redis, 2, [])
    async with run as (forwarded, reference, _group, _bodies):
        # The checkpoint's name and time are when it was written: the same moment nowhere.
        same_time = [CHECKPOINT_TIME.sub(b"checkpoint T", body) for body in forwarded]
        alone_time = [CHECKPOINT_TIME.sub(b"checkpoint T", body) for body in reference]
        assert b"checkpoint T" in same_time[len(BEFORE)]
        assert_same_bytes(same_time, alone_time)


async def test_the_balancer_spreads_requests_round_robin_and_streams_them_back(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path, redis
):
    home, project = make_project(tmp_path, None)
    args = ["--upstream", f"{upstream.url}/v1", "--allowed-roots", str(home)]
    async with cluster(client, tmp_path / "replicas", args, 2, redis.url) as group:
        balancer = Balancer([replica.url for replica in group.replicas])
        runner = web.AppRunner(balancer.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            url = f"http://127.0.0.1:{port}"
            bodies = conversation(project)[: len(BEFORE)]
            for body in bodies:
                await post(client, url, body)
            keys = set().union(*(keys_in(request.body) for request in upstream.requests))
            assert keys
            originals = originals_of(bodies)
            for key in sorted(keys):  # two in a row: each replica answers one
                assert await expand(client, url, key) == originals[key].encode()
                assert await expand(client, url, key) == originals[key].encode()
            async with client.get(url + "/health") as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("application/json")
        finally:
            await runner.cleanup()


async def test_a_note_kept_by_one_replica_is_recalled_by_another(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path, redis
):
    args = ["--upstream", f"{upstream.url}/v1", "--log-level", "warning"]
    system = {"role": "system", "content": "You are OpenCode."}  # no project
    kept = [system, {"role": "user", "content": "Remember: deploys go through ansible, never scp."}]
    asked = [system, {"role": "user", "content": "How do we deploy with ansible here?"}]
    requests = [("ses_note_kept", kept), ("ses_note_asked", asked)]

    async def send(group: Cluster) -> list[bytes]:
        upstream.requests.clear()
        for turn, (session, messages) in enumerate(requests):
            url = group.replicas[turn % len(group.replicas)].url
            async with client.post(
                url + "/v1/chat/completions",
                data=orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS}),
                headers={"x-session-id": session},
            ) as response:
                assert response.status == 200
        return [request.body for request in upstream.requests]

    async with cluster(client, tmp_path / "alone", args, 1, None) as alone:
        reference = await send(alone)
    assert b"never scp" in reference[1].split(b"How do we deploy", 1)[1]  # recalled
    async with cluster(client, tmp_path / "replicas", args, 2, redis.url) as group:
        assert_same_bytes(await send(group), reference)


def test_the_data_dir_given_after_the_double_dash_is_taken_out_to_be_shared():
    assert split_data_dir(["--upstream", "U", "--data-dir", "/d", "--cache-ttl", "5"]) == (
        Path("/d"),
        ["--upstream", "U", "--cache-ttl", "5"],
    )
    assert split_data_dir(["--data-dir=/e"]) == (Path("/e"), [])
    assert split_data_dir(["--upstream", "U"]) == (None, ["--upstream", "U"])


async def test_the_command_serves_until_sigterm_then_stops_replicas_and_redis(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path
):
    redis_server_program()  # installed on first use
    port = free_port()
    command = asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.replicas", "--port", str(port), "--replicas", "2",
        "--", "--upstream", f"{upstream.url}/v1", "--data-dir", str(tmp_path / "data"),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    process = await command
    try:
        assert process.stdout is not None
        ready = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert f"http://127.0.0.1:{port}" in ready and "2 replicas" in ready, ready
        children = [int(p) for p in re.findall(r"\d+", ready.split("(ports ", 1)[1])[:2]]
        redis_port = int(re.search(r"127\.0\.0\.1:(\d+)/0", ready).group(1))  # type: ignore[union-attr]
        assert (tmp_path / "data").is_dir()  # the one data dir both replicas share
        url = f"http://127.0.0.1:{port}"
        body = conversation(tmp_path)[1]
        for _ in range(2):
            await post(client, url, body)
        first, second = upstream.requests  # the same request twice, through both replicas
        assert first.body == second.body and first.header("x-session-id") == SESSION
        for child in children:  # one each
            async with client.get(f"http://127.0.0.1:{child}/stats") as response:
                stats = await response.json()
            assert [s["session_id"] for s in stats["sessions"]] == [SESSION]
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    for stopped in (port, *children, redis_port):
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", stopped), timeout=1).close()


async def test_project_memory_and_nudges_are_the_same_on_any_replica(
    upstream: FakeUpstream, client: aiohttp.ClientSession, tmp_path: Path, redis
):
    """The stable block, recall hits beside each user message and nudges with their cooldown
    (what was given when is shared state), round robin over three replicas."""
    home, project = make_project(tmp_path)
    args = ["--upstream", f"{upstream.url}/v1", "--allowed-roots", str(home)]
    args += ["--log-level", "warning", "--nudge-cooldown-turns", "1"]
    messages = memory_session(project)
    bodies = [
        {"model": "m", "stream": True, "messages": messages[:k], "tools": MEMORY_TOOLS}
        for k in request_points(messages)
    ]
    async with cluster(client, tmp_path / "alone", args, 1, None) as alone:
        await run_conversation(client, alone, bodies)
    reference = [request.body for request in upstream.requests]
    upstream.requests.clear()
    last_messages = [orjson.loads(body)["messages"][-1]["content"] for body in reference]
    assert any('kind="recall"' in str(content) for content in last_messages)
    assert any("deepmem_memory_store" in str(content) for content in last_messages)  # nudged
    async with cluster(client, tmp_path / "replicas", args, 3, redis.url) as group:
        await run_conversation(client, group, bodies, restart=lambda: group.restart(1))
    assert_same_bytes([request.body for request in upstream.requests], reference)
