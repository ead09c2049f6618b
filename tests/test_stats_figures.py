"""Honest numbers in /stats (issue 10, item 25): compression and memory injection counted
apart, one "tokens before" per measure with its meaning served beside it, sessions named by
title and project, and every recorded request carrying its kind for the chart."""

from __future__ import annotations

from typing import Any

import orjson

from compressors.tokens import estimate_bytes_tokens
from compressors.view import Dialect
from compressors.wire import parse_conversation
from proxy.sessions import STATS_EXPLAIN, session_title
from tests.test_memory_injection import make_project, post, request_points, session

TITLE_SYSTEM = "You are a title generator. You output ONLY a thread title."


def _figure(tally: dict[str, Any], path: str) -> Any:
    value: Any = tally
    for part in path.split("."):
        value = value[part]
    return value


async def test_a_one_request_session_with_memory_shows_injection_not_negative_compression(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    messages = session(project)
    await post(client, proxy, messages[: request_points(messages)[0]], session_id="ses_one")
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    [one] = stats["sessions"]
    received = one["request_tokens"]["tokens_before"]
    forwarded = one["request_tokens"]["tokens_after"]
    injected = one["memory"]["tokens_injected"]
    # Memory made this request bigger; before, that showed as a negative "reduction".
    assert forwarded > received and injected > 0
    assert one["compression"]["tokens_removed"] == 0
    # The forwarded size is explained by what was added (estimates: JSON escaping aside).
    assert abs((forwarded - received) - injected) <= 0.1 * injected
    assert one["project"] == str(project)
    assert one["title"] == "The pytest run of the fixture loader fails randomly, look…"


async def test_compression_and_injection_are_separate_and_every_figure_is_explained(
    start_proxy, upstream, client, tmp_path
):
    home, project = make_project(tmp_path)
    proxy = await start_proxy(upstream=[f"{upstream.url}/v1"], allowed_roots=str(home))
    messages = session(project)
    points = request_points(messages)[:8]
    for k in points:
        await post(client, proxy, messages[:k], session_id="ses_long")
    title_request = {
        "model": "m",
        "messages": [
            {"role": "system", "content": TITLE_SYSTEM},
            {"role": "user", "content": "Generate a title for this conversation:\n"},
            {"role": "user", "content": messages[1]["content"]},
        ],
    }
    async with client.post(
        proxy.url + "/v1/chat/completions",
        data=orjson.dumps(title_request),
        headers={"x-session-id": "ses_long"},
    ) as response:
        await response.read()
    async with client.get(proxy.url + "/stats") as response:
        stats = await response.json()
    totals = stats["totals"]
    compression, memory = totals["compression"], totals["memory"]
    assert compression["tokens_removed"] > 0 and memory["tokens_injected"] > 0
    assert compression["tokens_removed"] == (
        compression["tool_output_tokens_before"] - compression["tool_output_tokens_after"]
    )
    # One figure per name: the tool-output measure is named as such, not "tokens_before".
    assert "tokens_before" not in compression and "tokens_after" not in compression
    assert compression["tool_output_tokens_before"] < totals["request_tokens"]["tokens_before"]
    # Every explained figure exists, and the explanations are served with the figures.
    assert stats["explain"] == STATS_EXPLAIN
    for path in STATS_EXPLAIN:
        _figure(totals, path)

    async with client.get(proxy.url + "/stats", params={"session": "ses_long"}) as response:
        detail = (await response.json())["session"]
    ring = detail["recent_requests"]
    assert [r["kind"] for r in ring] == ["agent"] * len(points) + ["title"]
    assert sum(r["tokens_removed"] for r in ring) == detail["compression"]["tokens_removed"]
    assert sum(r["tokens_injected"] for r in ring) == detail["memory"]["tokens_injected"]
    assert ring[-1]["tokens_injected"] == 0 and ring[-1]["tokens_removed"] == 0
    forwarded = [r.body for r in upstream.requests if r.header("x-session-id") == "ses_long"]
    assert [r["tokens_after"] for r in ring] == [estimate_bytes_tokens(b) for b in forwarded]


def test_session_title_is_the_first_words_of_the_first_user_message():
    def title(*users: str) -> str | None:
        body = {"messages": [{"role": "user", "content": text} for text in users]}
        return session_title(parse_conversation(Dialect.OPENAI_CHAT, body))

    assert title("fix the flaky test\nmore details below", "second") == "fix the flaky test"
    assert title("  \n\nrename   the  module ") == "rename the module"
    assert title("one two three four five six seven eight nine ten eleven") == (
        "one two three four five six seven eight nine ten…"
    )
    assert title("x" * 200) == "x" * 80 + "…"
    assert title("") is None
