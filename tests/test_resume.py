"""A step compressed from where it differs (``compressors.pipeline._resume``) forwards the bytes,
and reports the figures, that compressing the whole request gives.

Each request of a session goes two ways, each with its own memo: as the proxy sends it, parsed
from where it differs from the session's last one (``proxy.bodies``) with the last request's
trail; and as a fresh parse, compressed whole.
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import compressors.pipeline as pipeline
from compressors.changes import Change
from compressors.pipeline import CompressionResult, CompressionSettings, SessionMemo, compress
from compressors.view import Dialect, Kind
from compressors.wire import FORMATS, parse_conversation
from proxy.bodies import BodyCache, write
from tests.strategies import (
    Answer,
    JsonObject,
    Reasoning,
    Rendered,
    Session,
    ToolCall,
    Turn,
    build_log,
    file_view,
    render,
    renderings,
    sessions,
    settings_strategy,
    with_cache_marks,
)
from tests.test_properties import PROPERTY, agent_session, colds, step


def _figures(result: CompressionResult) -> dict[str, Any]:
    def change(c: Change) -> tuple[Any, ...]:
        return (c.message, c.kind, c.key or "", c.text, c.chars_before, c.chars_after, c.new)

    return {
        "event": result.event,
        "counters": +result.counters,
        "originals": result.originals,
        "decisions": result.decisions,
        "tokens": (result.tokens_before, result.tokens_after),
        "changes": sorted(map(change, result.changes)),  # the order is not part of the result
        "kept_in_full": [c.fp for c in result.kept_in_full],
        "changed": result.changed,
    }


def both_ways(
    dialect: Dialect,
    requests: list[JsonObject],
    options: CompressionSettings,
    cold_flags: list[bool],
) -> int:
    """Send the session's requests both ways and compare them; how many were resumed."""
    wire = FORMATS[dialect]
    bodies = BodyCache()
    key = ("session", dialect.value)
    incremental, whole = SessionMemo(), SessionMemo()
    resumed = 0
    handed: dict[str, str] = {}  # the originals the session's last request named
    for index, request in enumerate(requests):
        cold = index < len(cold_flags) and cold_flags[index]
        raw = orjson.dumps(request)

        parsed = bodies.parse(key, wire, raw)
        conversation = parse_conversation(dialect, parsed.body)
        if parsed.start >= 0:
            conversation.share_messages(parsed.edits)
        result = compress(conversation, incremental, options, cache_cold=cold, seen=parsed.seen)
        resumed += any(found is result for found in RESUMED)
        sent = write(parsed, wire) or orjson.dumps(parsed.body)
        bodies.remember(key, raw, parsed)

        fresh = parse_conversation(dialect, copy.deepcopy(request))
        expected = compress(fresh, whole, options, cache_cold=cold)

        assert sent == orjson.dumps(fresh.body), f"request {index}"
        assert _figures(result) == _figures(expected), f"request {index}"
        # What it does not store before going upstream, the last request did.
        new = result.new_originals()
        assert new.items() <= result.originals.items()
        assert {k: v for k, v in result.originals.items() if k not in new}.items() <= handed.items()
        handed = result.originals
        assert (incremental.level, incremental.events, incremental.decisions) == (
            whole.level,
            whole.events,
            whole.decisions,
        )
    return resumed


def requests_of(rendered: Rendered) -> list[JsonObject]:
    return [rendered.request(boundary) for boundary in rendered.boundaries]


def with_moving_cache_marks(requests: list[JsonObject], dialect: Dialect) -> list[JsonObject]:
    """The requests as OpenCode sends Anthropic ones (``with_cache_marks``), in any format."""
    key = FORMATS[dialect].messages_key
    return [with_cache_marks(copy.deepcopy(request), key) for request in requests]


RESUMED: list[CompressionResult] = []  # what ``_resume`` returned, in this test


@pytest.fixture(autouse=True)
def _count_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pipeline._resume

    def counted(*args: Any) -> CompressionResult | None:
        found = real(*args)
        if found is not None:
            RESUMED.append(found)
        return found

    RESUMED.clear()
    monkeypatch.setattr(pipeline, "_resume", counted)


LOG = ToolCall("bash", {"command": "make"}, build_log(200, ["config", "parser"], []))
READ = ToolCall("read", {"filePath": "/repo/a.py"}, file_view("/repo/a.py", 150, ["a", "b"], []))
LS = ToolCall("bash", {"command": "ls"}, "README.md\nsrc")
LONG_LOG = ToolCall("bash", {"command": "make all"}, build_log(900, ["config", "parser"], []))
GREP = ToolCall("grep", {"pattern": "x"}, "\n".join(f"src/m{i}.py:{i}: x = {i}" for i in range(40)))
THINK = Reasoning("plan the next step", "c2ln")
# Two turns of several steps: reads, logs and small outputs, with reasoning, so most steps
# compress only what they add and some (a new turn, an output leaving the tail) all of it.
LONG = agent_session(
    Turn(
        "Fix the build",
        (step(LOG, think=THINK), step(LS), step(READ, GREP), step(LS), step(LS), step(LOG)),
        Answer(None, "fixed"),
    ),
    Turn("Now the tests", (step(READ, think=THINK), step(LS), step(LS), step(GREP)), None),
)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_steps_are_resumed_and_forward_what_the_whole_request_does(dialect: Dialect) -> None:
    requests = requests_of(render(LONG, dialect))
    assert len(requests) >= 10
    resumed = both_ways(dialect, requests, CompressionSettings(), [])
    assert resumed >= 3  # the property below would pass vacuously if nothing were resumed
    # Outputs leaving the tail make batch events, which compress repeated messages too.
    assert sum(result.event == "batch" for result in RESUMED) >= 2


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_new_user_turn_is_resumed_and_the_turn_that_was_live_made_old(dialect: Dialect) -> None:
    # The second turn's first request resumes the first turn's last one. The turn event
    # compresses what the first turn sent in full but its last step's output (the protected
    # tail), and the first turn's reasoning goes.
    last_read = ToolCall(
        "read", {"filePath": "/repo/b.py"}, file_view("/repo/b.py", 150, ["c", "d"], [])
    )
    session = agent_session(
        Turn("Fix the build", (step(READ, think=THINK), step(GREP), step(last_read)), None),
        Turn("Now the tests", (step(LS),), None),
    )
    requests = requests_of(render(session, dialect))
    both_ways(dialect, requests, CompressionSettings(), [])
    turn = next(result for result in RESUMED if result.event == "turn")
    assert turn.counters["reasoning_dropped"] >= 1
    assert READ.output in turn.originals.values()
    assert [candidate.output.text for candidate in turn.kept_in_full] == [last_read.output]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_steps_whose_last_messages_come_again_changed_are_resumed_before_them(
    dialect: Dialect,
) -> None:
    requests = with_moving_cache_marks(requests_of(render(LONG, dialect)), dialect)
    resumed = both_ways(dialect, requests, CompressionSettings(), [])
    # All but the first ones (the first mark moves off the first message, and the next
    # request shows that the last two come again): the new turn, and the step after it,
    # which sends the turn's user message and the answer before it again without marks.
    assert resumed >= len(requests) - 3
    assert sum(result.event == "batch" for result in RESUMED) >= 1
    assert any(result.event == "turn" for result in RESUMED)


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize("marks", [False, True])
def test_a_retry_of_the_same_body_is_resumed(dialect: Dialect, marks: bool) -> None:
    # A client sends a request again as it was (a retry after an error, or a benchmark):
    # nothing added, the last request's form is its own.
    requests = requests_of(render(LONG, dialect))
    if marks:
        requests = with_moving_cache_marks(requests, dialect)
    retried = [request for request in requests for _ in range(2)]
    resumed = both_ways(dialect, retried, CompressionSettings(), [])
    # All but the first (with moving marks, the first three: the first mark moves off the
    # first message, and the next request shows that the last two come again).
    assert resumed == len(retried) - (3 if marks else 1)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_last_messages_sent_again_with_other_outputs_leave_nothing_of_theirs_behind(
    dialect: Dialect,
) -> None:
    # A client clears the outputs of the messages it sends again: what the last request
    # made of them (a long log compressed on arrival, its original) is not carried on.
    session = agent_session(
        Turn("Fix the build", (step(LS), step(LONG_LOG), step(LS), step(GREP), step(LS)), None)
    )
    requests = with_moving_cache_marks(requests_of(render(session, dialect)), dialect)
    key = FORMATS[dialect].messages_key
    cleared_log = 0
    for index in range(1, len(requests) - 1):
        count = len(requests[index][key])
        cleared = copy.deepcopy(requests[index + 1])
        view = parse_conversation(dialect, cleared)
        for item in view.items:
            if item.kind is Kind.TOOL_RESULT and count - 2 <= item.message < count:
                cleared_log += item.text == LONG_LOG.output
                view.set_text(item, "[Old tool result content cleared]")
        both_ways(dialect, [*requests[: index + 1], cleared], CompressionSettings(), [])
    assert cleared_log == 1


@pytest.mark.parametrize("dialect", list(Dialect))
def test_pressure_after_a_resumed_batch_event_crosses_thresholds_as_the_whole_path(
    dialect: Dialect,
) -> None:
    # What a batch event saves in repeated messages no longer counts in the later steps'
    # pressure: a threshold anywhere in the session's range is crossed at the same step.
    requests = requests_of(render(LONG, dialect))
    for threshold in range(1_000, 20_001, 1_000):
        both_ways(dialect, requests, CompressionSettings(pressure_thresholds=(threshold,)), [])


@pytest.mark.parametrize("dialect", list(Dialect))
def test_a_cold_cache_or_a_client_rewrite_compresses_the_whole_request(dialect: Dialect) -> None:
    requests = requests_of(render(LONG, dialect))
    # Idle past the cache's life before every step: each may re-compress anything.
    assert both_ways(dialect, requests, CompressionSettings(), [True] * len(requests)) == 0
    # The client rewrites its history (OpenCode clears old tool outputs): the step after the
    # rewrite repeats none of the last request's messages past it, and is compressed whole.
    cleared = copy.deepcopy(requests[7])
    view = parse_conversation(dialect, cleared)
    first_result = next(item for item in view.items if item.kind is Kind.TOOL_RESULT)
    view.set_text(first_result, "[Old tool result content cleared]")
    RESUMED.clear()
    both_ways(dialect, [*requests[:6], cleared, *requests[8:]], CompressionSettings(), [])
    assert len(RESUMED) >= 1  # later steps are resumed again, from the rewritten history


@PROPERTY
@given(sessions(), settings_strategy, colds, st.booleans())
def test_resumed_steps_forward_the_bytes_of_the_whole_path(
    session: Session, options: CompressionSettings, cold_flags: list[bool], marks: bool
) -> None:
    for rendered in renderings(session):
        requests = requests_of(rendered)
        if marks:
            requests = with_moving_cache_marks(requests, rendered.dialect)
        both_ways(rendered.dialect, requests, options, cold_flags)
