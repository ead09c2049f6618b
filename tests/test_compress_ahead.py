"""Compressions computed ahead (``compressors.pipeline.precompute``, ``proxy.compression``):
a session compressed with them forwards exactly what it forwards without them, and the request
that finds one does not compress the output again."""

from __future__ import annotations

import asyncio
import copy
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import pytest
from hypothesis import given

import compressors.pipeline as pipeline
import compressors.registry as registry
from compressors.markers import ccr_key
from compressors.outputs import Budget, Compressed, CompressFn, ToolOutput
from compressors.pipeline import (
    CompressionSettings,
    Decision,
    Precomputed,
    SessionMemo,
    compress,
    compression_key,
    precompute,
)
from compressors.tokens import estimate_tokens
from compressors.view import Dialect
from compressors.wire import parse_conversation
from proxy.compression import AheadCache, CompressionStage
from tests.strategies import renderings, sessions, settings_strategy
from tests.test_properties import PROPERTY, colds
from tests.test_proxy_compression import TOOLS, numbered_file

JsonObject = dict[str, Any]
Outcome = tuple[str, Compressed] | None


def build_log(lines: int = 500) -> str:
    return "\n".join(
        f"[{n:04d}] compiling src/module_{n % 37}.c -> build/module_{n % 37}.o ok"
        for n in range(lines)
    )


def agent_requests(read_lines: int = 100) -> list[JsonObject]:
    """A session as a client sends it: each step reads a file or runs a build, and each
    request carries every earlier step. The last build's log is large enough to be compressed
    on arrival, the other outputs are sent in full while they are the latest step's."""
    messages: list[JsonObject] = [
        {"role": "system", "content": "You are OpenCode."},
        {"role": "user", "content": "Fix the parser bug in the module loader."},
    ]
    requests = []
    for index in range(6):
        call_id = f"call_{index}"
        tool, arguments, output = (
            ("bash", {"command": "make"}, build_log(100 if index < 5 else 500))
            if index in (2, 5)
            else (
                "read",
                {"filePath": f"/repo/f{index}.py"},
                numbered_file(f"f{index}", read_lines),
            )
        )
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": tool, "arguments": json.dumps(arguments)},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": output},
        ]
        requests.append({"model": "m", "messages": copy.deepcopy(messages), "tools": TOOLS})
    return requests


@dataclass
class Sent:
    body: bytes
    counters: Counter[str]
    decisions: dict[str, Decision]
    event: str | None
    compressor_calls: int  # per-tool compressions run by ``compress`` itself
    ahead_calls: int = 0  # and by ``precompute`` after it


@dataclass
class Calls:
    count: int = 0
    outputs: list[str] = field(default_factory=list)


def replay(
    requests: list[tuple[Dialect, JsonObject]],
    settings: CompressionSettings,
    ahead: AheadCache | None,
    calls: Calls,
    cold_flags: list[bool] | None = None,
) -> list[Sent]:
    """Each request through one memo; with ``ahead``, each followed by what the proxy defers."""
    memo, sent = SessionMemo(), []
    cold_flags = cold_flags or []
    for index, (dialect, request) in enumerate(requests):
        body = copy.deepcopy(request)
        cold = cold_flags[index] if index < len(cold_flags) else False
        before = calls.count
        result = compress(
            parse_conversation(dialect, body), memo, settings, cache_cold=cold, ahead=ahead
        )
        sent.append(
            Sent(
                orjson.dumps(body),
                result.counters,
                result.decisions,
                result.event,
                calls.count - before,
            )
        )
        if ahead is not None:
            before = calls.count
            ahead.put_many(precompute(result, memo.level, settings, ahead).compressions)
            sent[-1].ahead_calls = calls.count - before
    return sent


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Counts the outputs the pipeline runs a per-tool compressor on (not those it only
    recognises the kind of, on arrival)."""
    counted = Calls()
    real_candidates = registry.candidates
    ran: list[bool] = []

    def running(compress: CompressFn) -> CompressFn:
        def run(output: ToolOutput, budget: Budget) -> Compressed | None:
            ran.append(True)
            return compress(output, budget)

        return run

    def candidates(output: ToolOutput) -> list[registry.ToolCompressor]:
        return [replace(c, compress=running(c.compress)) for c in real_candidates(output)]

    def counting(entry: Callable[..., Outcome]) -> Callable[..., Outcome]:
        def count(output: ToolOutput, *args: Any) -> Outcome:
            ran.clear()
            outcome = entry(output, *args)
            if ran:
                counted.count += 1
                counted.outputs.append(output.text)
            return outcome

        return count

    monkeypatch.setattr(registry, "candidates", candidates)
    monkeypatch.setattr(pipeline, "compress_output", counting(pipeline.compress_output))
    monkeypatch.setattr(pipeline, "compress_on_arrival", counting(pipeline.compress_on_arrival))
    return counted


def test_a_warmed_session_forwards_the_same_bytes_without_compressing_again(calls: Calls) -> None:
    requests = [(Dialect.OPENAI_CHAT, request) for request in agent_requests()]
    settings = CompressionSettings()
    cold = replay(requests, settings, None, calls)
    ahead = AheadCache()
    warm = replay(requests, settings, ahead, calls)
    assert [s.body for s in warm] == [s.body for s in cold]
    assert [s.counters for s in warm] == [s.counters for s in cold]
    assert [s.decisions for s in warm] == [s.decisions for s in cold]
    assert [s.event for s in warm] == [s.event for s in cold]
    # Each request compresses the step before it (the last one also the log on arrival)...
    assert [s.compressor_calls for s in cold] == [0, 1, 1, 1, 1, 2]
    assert (
        sum(s.counters["compressed:file_read"] + s.counters["compressed:shell"] for s in cold) == 6
    )
    # ... with them computed ahead, only the arrival is left on the request path.
    assert [s.compressor_calls for s in warm] == [0, 0, 0, 0, 0, 1]
    assert [s.ahead_calls for s in warm] == [1, 1, 1, 1, 1, 0]
    assert (ahead.hits, ahead.misses) == (5, 0)


def test_a_large_read_is_only_recognised_on_arrival_and_compressed_ahead(calls: Calls) -> None:
    """A file read large enough to be compressed on arrival, were it a listing or a log, is
    told apart by its shape and sent in full without being compressed on the request path;
    its compression is computed once the answer is out, and the next request takes it."""
    requests = [(Dialect.OPENAI_CHAT, request) for request in agent_requests(read_lines=400)]
    settings = CompressionSettings()
    assert all(
        estimate_tokens(request["messages"][-1]["content"]) >= settings.arrival_tokens
        for _, request in requests
        if request["messages"][-2]["tool_calls"][0]["function"]["name"] == "read"
    )
    cold = replay(requests, settings, None, calls)
    warm = replay(requests, settings, AheadCache(), calls)
    assert [s.body for s in warm] == [s.body for s in cold]
    assert [s.counters for s in warm] == [s.counters for s in cold]
    assert [s.decisions for s in warm] == [s.decisions for s in cold]
    # Reads arrive at 0, 1, 3, 4 (sent in full), the large log at 5 (compressed on arrival
    # and sent so); each request compresses the step before it.
    assert [s.compressor_calls for s in cold] == [0, 1, 1, 1, 1, 2]
    assert [s.compressor_calls for s in warm] == [0, 0, 0, 0, 0, 1]  # the log's arrival only
    assert [s.ahead_calls for s in warm] == [1, 1, 1, 1, 1, 0]
    assert cold[0].body == orjson.dumps(requests[0][1])  # the first read, untouched


def test_a_compression_made_for_another_level_or_focus_is_not_used(calls: Calls) -> None:
    """The key holds what the result depends on: a level, a task or settings of their own
    find nothing, and compress computes what it computes without a cache."""
    request = agent_requests()[4]
    settings = CompressionSettings()
    body = copy.deepcopy(request)
    result = compress(parse_conversation(Dialect.OPENAI_CHAT, body), SessionMemo(), settings)
    [kept] = result.kept_in_full  # the latest step's read, sent in full
    key = compression_key(kept, 1, settings)
    others = [
        compression_key(kept, 2, settings),
        compression_key(
            replace(kept, output=replace(kept.output, focus=frozenset({"x"}))), 1, settings
        ),
        compression_key(kept, 1, replace(settings, level_ratios=(0.3, 0.12, 0.08))),
    ]
    assert len({key, *others}) == 4
    [(found_key, found)] = precompute(result, 1, settings).compressions
    assert found_key == key and found.text is not None and found.counter == "compressed:file_read"


def test_a_hit_returns_what_was_stored_and_counts_as_compressing() -> None:
    """compress takes what the cache holds as the compression: a wrong entry would show."""
    request = agent_requests()[4]
    settings = CompressionSettings()
    memo = SessionMemo()
    body = copy.deepcopy(request)
    first = compress(parse_conversation(Dialect.OPENAI_CHAT, body), memo, settings)
    [kept] = first.kept_in_full
    forged = Precomputed(1, "[deep-memory: stored ahead]\nshort", False, "compressed:forged")
    ahead = AheadCache()
    ahead.put_many([(compression_key(kept, 1, settings), forged)])
    messages = request["messages"] + [
        {"role": "assistant", "content": None, "tool_calls": [_call("call_x", "read")]},
        {"role": "tool", "tool_call_id": "call_x", "content": numbered_file("next")},
    ]
    body = {**request, "messages": messages}
    result = compress(parse_conversation(Dialect.OPENAI_CHAT, body), memo, settings, ahead=ahead)
    assert result.counters["compressed:forged"] == 1 and ahead.hits == 1
    assert body["messages"][-3]["content"] == forged.text


def _call(call_id: str, tool: str) -> JsonObject:
    return {"id": call_id, "type": "function", "function": {"name": tool, "arguments": "{}"}}


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_compressions_ahead_change_nothing(
    session: Any, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Whatever the session, settings and cache state: the same bytes, counters, decisions
    and events with compressions computed ahead as without."""
    calls = Calls()
    for rendered in renderings(session):
        requests = [(rendered.dialect, rendered.request(b)) for b in rendered.boundaries]
        cold = replay(requests, options, None, calls, cold_flags)
        warm = replay(requests, options, AheadCache(), calls, cold_flags)
        assert [s.body for s in warm] == [s.body for s in cold]
        assert [s.counters for s in warm] == [s.counters for s in cold]
        assert [s.decisions for s in warm] == [s.decisions for s in cold]
        assert [s.event for s in warm] == [s.event for s in cold]


def test_the_cache_drops_the_least_recently_used_first() -> None:
    def entry(chars: int) -> Precomputed:
        return Precomputed(1, "x" * chars, False, "compressed:generic")

    def key(name: str) -> Any:
        return (name, frozenset(), 1, None, CompressionSettings())

    cache = AheadCache(max_chars=10_000, max_entries=3)
    cache.put_many([(key("a"), entry(10)), (key("b"), entry(10)), (key("c"), entry(10))])
    assert cache.get(key("a")) is not None  # a is used: b is now the oldest
    cache.put_many([(key("d"), entry(10))])
    assert [k in cache for k in map(key, "abcd")] == [True, False, True, True]
    cache.put_many([(key("e"), entry(9_500))])  # c goes for the count, a for the characters
    assert [k in cache for k in map(key, "acde")] == [False, False, True, True]
    assert cache.chars <= 10_000 and len(cache) == 2
    assert (cache.hits, cache.misses) == (1, 0)
    assert cache.get(key("b")) is None and cache.misses == 1


# --- through the running proxy ----------------------------------------------------------


def _stage(proxy: Any) -> CompressionStage:
    return next(a for a in proxy.state.addons if isinstance(a, CompressionStage))


async def test_the_proxy_compresses_ahead_after_the_answer_and_uses_it_next(
    start_proxy: Any, upstream: Any, client: Any
) -> None:
    upstream.chunk_delay = 0.05
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"])
    stage = _stage(proxy)
    first, second = agent_requests()[:2]

    async def post(request: JsonObject, check_while_streaming: bool = False) -> None:
        body = orjson.dumps({**request, "stream": True})
        async with client.post(
            proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": "ses_ahead"}
        ) as response:
            assert response.status == 200
            await response.content.readany()
            if check_while_streaming:  # the answer is not out: nothing was computed yet
                assert len(stage.ahead) == 0
            await response.read()

    await post(first, check_while_streaming=True)
    for _ in range(200):  # the first step's read, compressed once the answer was relayed
        if len(stage.ahead):
            break
        await asyncio.sleep(0.01)
    assert len(stage.ahead) == 1 and stage.ahead.hits == 0
    # Its original is kept durably before any marker names it: the step that sends the
    # compression commits nothing for it on its way upstream.
    read = first["messages"][3]["content"]
    for _ in range(200):
        if stage.originals.get(ccr_key(read)) is not None:
            break
        await asyncio.sleep(0.01)
    assert stage.originals.get(ccr_key(read)) == read.encode()
    written: list[int] = []
    real_put = stage.originals.put_many

    def put_many(originals: Any) -> int:
        written.append(real_put(originals))
        return written[-1]

    stage.originals.put_many = put_many  # type: ignore[method-assign]
    await post(second)
    assert stage.ahead.hits == 1 and stage.ahead.misses == 0
    sent = orjson.loads(upstream.requests[-1].body)["messages"]
    assert sent[3]["content"].startswith("[deep-memory: ")  # the first read, compressed
    assert ccr_key(read) in sent[3]["content"]
    assert sent[5]["content"] == second["messages"][5]["content"]  # the latest, in full
    assert written and not any(written[:1])  # the request's put: every original known


def test_a_step_keeps_on_its_way_only_the_originals_no_earlier_step_handed_over(
    tmp_path: Any,
) -> None:
    """Each step of a session names every original its markers point at. Before it goes
    upstream it stores only those the session's last step did not name (that step stored
    them), and without one it opens no transaction; the others are refreshed once the answer
    is out (its deferred work). Every key its body names is stored before it goes."""
    from compressors.markers import marker_keys
    from proxy.addons import build_addons
    from proxy.bodies import BodyCache
    from proxy.config import load_settings
    from proxy.memory_api import memory_service
    from proxy.pipeline import rewrite_request
    from proxy.stores import open_stores

    settings = load_settings(
        {"data_dir": str(tmp_path / "data"), "memory_semantic": "off", "tail_tokens": 0},
        environ={},
    )
    stores = open_stores(settings, in_memory=True)
    addons = build_addons(settings, stores, memory_service(settings))
    stage = next(a for a in addons if isinstance(a, CompressionStage))
    puts: list[set[str]] = []
    transactions: list[int] = []
    real_put, real_transaction = stage.originals.put_many, stage.transaction

    def put_many(originals: Any) -> int:
        puts.append(set(originals))
        return real_put(originals)

    def transaction() -> Any:
        transactions.append(1)
        return real_transaction()

    stage.originals.put_many = put_many  # type: ignore[method-assign]
    stage.transaction = transaction
    bodies, headers = BodyCache(), {"x-session-id": "ses_kept"}
    named: set[str] = set()  # by the last step's markers
    quiet = 0
    for index, request in enumerate(agent_requests()):
        puts.clear()
        transactions.clear()
        raw = orjson.dumps(request)
        rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, addons, bodies=bodies)
        sent = orjson.loads(rewrite.body)["messages"]
        keys = {
            key for m in sent if isinstance(m["content"], str) for key in marker_keys(m["content"])
        }
        assert all(stage.originals.get(key) is not None for key in keys), f"step {index}"
        on_the_way = set().union(*puts)
        assert not on_the_way & named, f"step {index}: stored again before going upstream"
        if not on_the_way:
            quiet += 1
            assert not transactions, f"step {index}: a transaction with nothing to keep"
        puts.clear()
        assert rewrite.flow is not None
        for job in rewrite.flow.after:  # the answer is out
            job()
        if index and named:
            assert named <= set().union(*puts), f"step {index}: not kept alive"
        named = keys
    assert quiet and named  # both kinds of step were seen
