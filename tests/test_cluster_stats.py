"""/stats across replicas that share a Redis server: each names itself and publishes its own
figures; any of them answers with every live replica's merged, names the replica that served
each request, forgets a replica that stopped publishing, and falls back to its own figures
when Redis is away."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import cluster, statistics
from proxy.app import STATE
from proxy.config import load_settings
from proxy.costs import StreamTokens
from proxy.sessions import RECENT_REQUESTS, RequestRecord
from tests.test_durability import health, post, request_body

SESSION = "ses_cluster"
LONE = "ses_only_on_a"


async def stats(client, proxy, query: str = "") -> dict[str, Any]:
    async with client.get(proxy.url + "/stats" + query) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def publish(*replicas) -> None:
    await asyncio.sleep(0.05)  # the last answer's figures are counted after it is sent
    for replica in replicas:
        await statistics.publish_once(replica.app[STATE])


async def two_replicas(start_proxy, upstream, tmp_path, redis):
    return [
        await start_proxy(
            upstream=[f"{upstream.url}/v1"],
            data_dir=str(tmp_path / name),
            state_url=redis.url,
            replica_name=name,
        )
        for name in ("replica-a", "replica-b")
    ]


# --- merging, pure ----------------------------------------------------------------------------


def test_summed_adds_numbers_and_merges_nested_figures():
    a = {"requests": 2, "kinds": {"agent": 2}, "cost": {"saved": 0.1}, "name": "a", "on": True}
    b = {"requests": 3, "kinds": {"agent": 1, "title": 1}, "cost": {"saved": 0.2}, "name": "b"}
    assert cluster.summed([a, b]) == {
        "requests": 5,
        "kinds": {"agent": 3, "title": 1},
        "cost": {"saved": 0.3},
        "name": "a",
        "on": True,
    }
    assert a["kinds"] == {"agent": 2}  # the parts are not changed


FIGURES = st.dictionaries(
    st.sampled_from(["requests", "errors", "bytes_in"]), st.integers(0, 10**9), min_size=1
)


PARTS = st.lists(
    st.fixed_dictionaries({"kinds": FIGURES, "requests": st.integers(0, 99)}), max_size=5
)


@given(PARTS)
def test_summed_is_the_sum_of_each_figure_and_leaves_the_parts_alone(parts):
    before = orjson.dumps(parts)
    total = cluster.summed(parts)
    assert orjson.dumps(parts) == before
    if parts:
        assert total["requests"] == sum(part["requests"] for part in parts)
        for key in {key for part in parts for key in part["kinds"]}:
            assert total["kinds"][key] == sum(part["kinds"].get(key, 0) for part in parts)
    assert cluster.summed(reversed(parts)) == total


def session(at: float, replica: str, title: str | None, requests: int) -> dict[str, Any]:
    records = [{"at": at + k, "replica": replica, "tokens_before": 1} for k in range(requests)]
    return {
        "session_id": "s",
        "title": title,
        "first_seen": at,
        "last_seen": at + requests,
        "last_usage": {"input_tokens": int(at)},
        "last_usage_at": at,
        "requests": requests,
        "kinds": {"agent": requests},
        "recent_requests": records,
    }


def test_a_session_seen_by_two_replicas_is_merged():
    early = session(100.0, "a", "fix the bug", 3)
    late = session(101.5, "b", None, RECENT_REQUESTS)
    merged = cluster.merge_session([early, late])
    assert merged["requests"] == 3 + RECENT_REQUESTS
    assert merged["kinds"] == {"agent": 3 + RECENT_REQUESTS}
    assert merged["first_seen"] == 100.0 and merged["last_seen"] == late["last_seen"]
    assert merged["title"] == "fix the bug"  # the latest replica's is None: another's
    assert merged["last_usage"] == {"input_tokens": 101}  # the latest usage read
    times = [record["at"] for record in merged["recent_requests"]]
    assert times == sorted(times) and len(times) == RECENT_REQUESTS  # the newest, oldest first
    assert {record["replica"] for record in merged["recent_requests"]} == {"a", "b"}
    listed = cluster.merge_sessions([[early], [late]])
    assert len(listed) == 1 and "recent_requests" not in listed[0]


def test_a_snapshot_goes_through_its_encoding_and_garbage_does_not():
    snapshot = {"replica": "r", "totals": {"requests": 1}, "sessions": []}
    assert cluster.decode(cluster.encode(snapshot)) == snapshot
    for garbage in (b"", b"not zlib", cluster.encode({"no": "totals"})):
        with pytest.raises(ValueError):
            cluster.decode(garbage)


def test_a_request_record_goes_through_its_row_and_comes_back_named():
    record = RequestRecord(1.5, "agent", StreamTokens(100, 40, 60, 30), "a", 200, 45, 5)
    assert RequestRecord.from_row(orjson.loads(orjson.dumps(record.row())), "a") == record
    assert "replica" not in str(record.row())


def test_the_default_replica_name_is_the_host_and_port():
    settings = load_settings({"port": "9123"}, environ={})
    assert cluster.replica_name(settings) == f"{socket.gethostname()}:9123"
    named = load_settings({}, environ={"DEEP_MEMORY_REPLICA_NAME": "eu-1"})
    assert cluster.replica_name(named) == "eu-1"


# --- replicas on a real Redis -----------------------------------------------------------------


async def test_either_replica_shows_the_whole_cluster(
    start_proxy, upstream, client, tmp_path, redis
):
    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    steps = range(3, 9)
    for turn, step in enumerate(steps):  # round robin
        await post(client, group[turn % 2], request_body(step), SESSION)
    await post(client, group[0], request_body(3), LONE)
    await publish(*group)

    local = [await stats(client, replica, "?scope=local") for replica in group]
    assert [view["scope"] for view in local] == ["local", "local"]
    assert [view["totals"]["requests"] for view in local] == [4, 3]
    for replica, name in zip(group, ("replica-a", "replica-b"), strict=True):
        view = await stats(client, replica)
        assert view["scope"] == "cluster" and view["replica"] == name
        assert [r["name"] for r in view["replicas"]] == ["replica-a", "replica-b"]
        totals = view["totals"]
        assert totals["requests"] == 7 and totals["sessions"] == 2
        for figure in ("bytes_in", "bytes_out"):
            assert totals[figure] == sum(part["totals"][figure] for part in local)
        assert totals["request_tokens"]["tokens_before"] == sum(
            part["totals"]["request_tokens"]["tokens_before"] for part in local
        )
        by_id = {s["session_id"]: s for s in view["sessions"]}
        assert by_id[SESSION]["requests"] == len(steps) and by_id[LONE]["requests"] == 1

        detail = (await stats(client, replica, f"?session={SESSION}"))["session"]
        assert detail["requests"] == len(steps)
        recent = detail["recent_requests"]
        assert len(recent) == len(steps)
        assert [r["at"] for r in recent] == sorted(r["at"] for r in recent)
        assert [r["replica"] for r in recent] == ["replica-a", "replica-b"] * 3
        assert all(r["status"] == 200 for r in recent)

    status, report = await health(client, group[1])
    assert status == 200 and report["replica"] == "replica-b"
    assert report["statistics"]["published_at"] and report["statistics"]["publish_error"] is None


async def test_a_replica_that_stopped_publishing_drops_out(
    start_proxy, upstream, client, tmp_path, redis, monkeypatch
):
    monkeypatch.setattr(cluster, "TTL_SECONDS", 1)
    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    await post(client, group[0], request_body(3), SESSION)
    await post(client, group[1], request_body(4), SESSION)
    await publish(*group)
    assert (await stats(client, group[0]))["totals"]["requests"] == 2

    group[1].app[STATE].publishing.cancel()  # B stops publishing (as if it were gone)
    await asyncio.sleep(1.2)
    view = await stats(client, group[0])
    assert [r["name"] for r in view["replicas"]] == ["replica-a"]
    assert view["totals"]["requests"] == 1
    assert view["sessions"][0]["requests"] == 1
    assert "replica-b" not in redis.command("SMEMBERS", "deepmem:replicas")  # name dropped too


async def test_a_snapshot_that_cannot_be_read_is_left_out(
    start_proxy, upstream, client, tmp_path, redis
):
    from memory.redis_state import RedisState, RedisStatisticsBoard

    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    await post(client, group[1], request_body(3), SESSION)
    await publish(*group)

    def publish_garbage() -> None:
        state = RedisState(redis.url)
        try:
            RedisStatisticsBoard(state).publish("from-the-future", b"\x00garbage", 60)
        finally:
            state.close()

    await asyncio.to_thread(publish_garbage)
    view = await stats(client, group[0])
    assert [r["name"] for r in view["replicas"]] == ["replica-a", "replica-b"]
    assert view["totals"]["requests"] == 1


async def test_a_replica_publishes_its_last_figures_when_it_stops(
    start_proxy, upstream, client, tmp_path, redis
):
    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    await post(client, group[0], request_body(3), SESSION)
    await post(client, group[1], request_body(4), SESSION)
    await post(client, group[1], request_body(5), SESSION)
    await asyncio.sleep(0.05)
    await group[1].runner.cleanup()  # nothing published since it started, but on its way out
    view = await stats(client, group[0])
    assert view["totals"]["requests"] == 3
    assert [r["name"] for r in view["replicas"]] == ["replica-a", "replica-b"]


async def test_without_redis_stats_answer_with_the_local_figures(
    start_proxy, upstream, client, tmp_path, redis
):
    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    await post(client, group[0], request_body(3), SESSION)
    await post(client, group[1], request_body(4), SESSION)
    await publish(*group)
    redis.stop()

    view = await stats(client, group[0])
    assert view["scope"] == "local" and "unavailable" in view["cluster_error"]
    assert view["totals"]["requests"] == 1
    assert [r["name"] for r in view["replicas"]] == ["replica-a"]
    detail = await stats(client, group[0], f"?session={SESSION}")
    assert detail["scope"] == "local" and detail["session"]["requests"] == 1
    await publish(group[0])
    _, report = await health(client, group[0])
    assert report["statistics"]["publish_error"]


async def test_two_replicas_of_one_name_are_told_to_change_it(
    start_proxy, upstream, client, tmp_path, redis
):
    twins = [
        await start_proxy(
            upstream=[f"{upstream.url}/v1"],
            data_dir=str(tmp_path / f"twin{k}"),
            state_url=redis.url,
            replica_name="twin",
        )
        for k in range(2)
    ]
    await publish(twins[1])
    view = await stats(client, twins[0])
    assert "give each replica its own replica_name" in view["cluster_warning"]
    assert "cluster_warning" not in await stats(client, twins[1])


async def test_one_process_names_itself_on_every_request(start_proxy, upstream, client):
    alone = await start_proxy(upstream=[f"{upstream.url}/v1"], replica_name="solo")
    await post(client, alone, request_body(3), SESSION)
    view = await stats(client, alone)
    assert view["replica"] == "solo" and view["scope"] == "local"
    assert [r["name"] for r in view["replicas"]] == ["solo"]
    assert "cluster_error" not in view
    detail = await stats(client, alone, f"?session={SESSION}")
    assert [r["replica"] for r in detail["session"]["recent_requests"]] == ["solo"]
    async with client.get(alone.url + "/stats?scope=everything") as response:
        assert response.status == 400
    status, report = await health(client, alone)
    assert status == 200 and report["replica"] == "solo" and "statistics" not in report


@pytest.mark.slow
async def test_the_dashboard_shows_the_replicas_and_who_served_each_request(
    start_proxy, upstream, client, tmp_path, redis
):
    from tests.test_dashboard import chromium_page

    group = await two_replicas(start_proxy, upstream, tmp_path, redis)
    for turn, step in enumerate(range(3, 7)):
        await post(client, group[turn % 2], request_body(step), SESSION)
    await publish(*group)
    async with chromium_page(tmp_path) as page:
        await page.navigate(f"{group[1].url}/#session={SESSION}")
        await page.wait_for("document.querySelectorAll('#requests tbody tr').length === 4")
        replicas = await page.evaluate(
            "[...document.querySelectorAll('#replicas tbody tr')].map(r => r.dataset.replica)"
        )
        assert replicas == ["replica-a", "replica-b"]
        assert not await page.evaluate("document.getElementById('replicas-panel').hidden")
        served_by = await page.evaluate(
            "[...document.querySelectorAll('#requests td.replica')].map(td => td.textContent)"
        )
        assert served_by == ["replica-b", "replica-a"] * 2  # newest first
        assert "2 replicas" in await page.evaluate("document.getElementById('replica').textContent")
