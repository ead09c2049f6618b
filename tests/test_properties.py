"""Property tests of the compression pipeline and the proxy's rewrite hook.

Each generated session (``tests.strategies``) is rendered in all three wire formats and
replayed as a client sends it: request k is the body with the first k messages, at every
point a client would send one (after a user message, after a step's tool results), all
through one ``SessionMemo`` per format. The input of each request is compared with what
``compress`` made of it, item by item: ``align`` pairs every input item with its output item
and names the reasoning that was dropped whole; the checks work on those pairs.

The minimal sessions that showed the bugs these properties found are explicit ``@example``s,
so every run replays them. A property that still fails because of an open bug is marked
``xfail(strict=True)`` with its minimal example, so it fails on every run until fixed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from compressors.markers import MARKER_RE, ccr_key, marker_keys, utf8
from compressors.pipeline import (
    CompressionResult,
    CompressionSettings,
    SessionMemo,
    compress,
)
from compressors.tokens import estimate_tokens
from compressors.view import Conversation, Dialect, Item, Kind, Role
from compressors.wire import parse_conversation, without_cache_marks
from memory.ccr import OriginalStore
from memory.db import open_database
from proxy.addons import build_addons
from proxy.config import load_settings
from proxy.flow import Addon
from proxy.memory_api import memory_service
from proxy.pipeline import Outcome, Rewrite, rewrite_request
from proxy.stores import Stores, open_stores
from tests.conftest import ROOT
from tests.strategies import (
    WORDS,
    Answer,
    Boundary,
    Reasoning,
    Rendered,
    Session,
    Step,
    ToolCall,
    Turn,
    build_log,
    file_view,
    grep_output,
    json_array,
    path_listing,
    reminder,
    render,
    renderings,
    report,
    sessions,
    settings_strategy,
    unit_test_log,
)

JsonObject = dict[str, Any]

# DEEPMEM_PROPERTY_EXAMPLES=500 for a deeper search than the default run's.
PROPERTY = settings(
    max_examples=int(os.environ.get("DEEPMEM_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
STRICT = CompressionSettings(arrival_kinds=frozenset())  # nothing compressed on arrival
colds = st.lists(st.booleans(), max_size=16)  # per request: is the provider cache cold?


def dumps(value: Any) -> bytes:
    return orjson.dumps(value)


# --- one request, compared item by item ----------------------------------------------------


@dataclass
class Alignment:
    pairs: list[tuple[Item, Item]]  # (input item, output item)
    dropped: list[Item]  # input reasoning items that are gone from the output


@dataclass
class Sent:
    """One request of a session: what the client sent and what the proxy made of it."""

    dialect: Dialect
    boundary: Boundary
    request: JsonObject  # the client's body, untouched
    body: JsonObject  # the body after compression
    before: Conversation
    after: Conversation
    result: CompressionResult
    alignment: Alignment

    @property
    def live_start(self) -> int:
        return self.before.last_user_message

    @property
    def changed_pairs(self) -> Iterator[tuple[Item, Item]]:
        return ((old, new) for old, new in self.alignment.pairs if old.text != new.text)


def describe(item: Item) -> str:
    call = f" call {item.call_id}" if item.call_id else ""
    return f"{item.role} {item.kind} of message {item.message}{call}"


def _same_slot(old: Item, new: Item) -> bool:
    if (old.kind, old.role, old.call_id, old.tool_name) != (
        new.kind,
        new.role,
        new.call_id,
        new.tool_name,
    ):
        return False
    if old.kind in (Kind.REASONING, Kind.TOOL_CALL):
        return dumps(old.value) == dumps(new.value)
    return True


def align(before: Conversation, after: Conversation) -> Alignment:
    """Pair input and output items in order; only reasoning may be missing from the output."""
    pairs: list[tuple[Item, Item]] = []
    dropped: list[Item] = []
    out = after.items
    j = 0
    for item in before.items:
        if j < len(out) and _same_slot(item, out[j]):
            pairs.append((item, out[j]))
            j += 1
        elif item.kind is Kind.REASONING:
            dropped.append(item)
        else:
            raise AssertionError(f"{describe(item)} has no counterpart in the output")
    assert j == len(out), f"items appeared: {[describe(i) for i in out[j:]]}"
    return Alignment(pairs, dropped)


def list_key(dialect: Dialect) -> str:
    return "input" if dialect is Dialect.OPENAI_RESPONSES else "messages"


def _remove_whole(dialect: Dialect, body: JsonObject, items: list[Item]) -> None:
    """Remove reasoning the way "dropped whole" means it: the field, the block, the item."""
    doomed_entries = set()
    for item in items:
        if dialect is Dialect.OPENAI_CHAT:
            del item.holder[item.key]
        elif dialect is Dialect.ANTHROPIC:
            content = body["messages"][item.message]["content"]
            content[:] = [block for block in content if block is not item.holder]
        else:
            doomed_entries.add(item.message)
    if doomed_entries:
        body["input"] = [e for i, e in enumerate(body["input"]) if i not in doomed_entries]


def skeleton(dialect: Dialect, body: JsonObject) -> bytes:
    """The body with the value of every item blanked: its structure, ids and extras."""
    body = copy.deepcopy(body)
    for item in parse_conversation(dialect, body).items:
        item.holder[item.key] = None
    return dumps(body)


def output_index(sent: Sent, message: int) -> int:
    """Where input message ``message`` sits in the output (Responses drops whole items)."""
    if sent.dialect is not Dialect.OPENAI_RESPONSES:
        return message
    gone = {item.message for item in sent.alignment.dropped}
    return message - sum(1 for index in gone if index < message)


def send(
    rendered: Rendered,
    boundary: Boundary,
    memo: SessionMemo,
    options: CompressionSettings,
    cold: bool = False,
    request: JsonObject | None = None,
) -> Sent:
    request = rendered.request(boundary) if request is None else request
    body = copy.deepcopy(request)
    result = compress(parse_conversation(rendered.dialect, body), memo, options, cache_cold=cold)
    before = parse_conversation(rendered.dialect, copy.deepcopy(request))
    after = parse_conversation(rendered.dialect, body)
    sent = Sent(rendered.dialect, boundary, request, body, before, after, result, Alignment([], []))
    sent.alignment = align(before, after)
    return sent


def replay(
    rendered: Rendered,
    options: CompressionSettings,
    cold_flags: list[bool] | None = None,
    memo: SessionMemo | None = None,
) -> Iterator[tuple[Sent, SessionMemo]]:
    """The session's requests in order, through one memo."""
    memo = SessionMemo() if memo is None else memo
    cold_flags = cold_flags or []
    for index, boundary in enumerate(rendered.boundaries):
        cold = cold_flags[index] if index < len(cold_flags) else False
        yield send(rendered, boundary, memo, options, cold), memo


# --- the checks ----------------------------------------------------------------------------


def check_paired_and_whole(sent: Sent) -> None:
    """Property 1 on one request (``align`` already checked that only reasoning vanished)."""
    for item in sent.alignment.dropped:
        assert 0 <= item.message < sent.live_start, f"{describe(item)} dropped from the live turn"

    def ids(conversation: Conversation, kind: Kind) -> list[str | None]:
        return [item.call_id for item in conversation.items if item.kind is kind]

    for kind in (Kind.TOOL_CALL, Kind.TOOL_RESULT):
        assert ids(sent.after, kind) == ids(sent.before, kind)
    expected = copy.deepcopy(sent.request)
    items = parse_conversation(sent.dialect, expected).items
    index = {id(item): n for n, item in enumerate(sent.before.items)}
    _remove_whole(sent.dialect, expected, [items[index[id(i)]] for i in sent.alignment.dropped])
    assert skeleton(sent.dialect, sent.body) == skeleton(sent.dialect, expected)


def expand_inline(text: str, originals: dict[str, str]) -> str:
    return MARKER_RE.sub(lambda match: originals[match.group("key")], text)


def check_markers(sent: Sent, store: OriginalStore) -> None:
    """Property 3: every replaced text is reachable, byte for byte, through its marker."""
    originals = sent.result.originals
    for key, original in originals.items():
        assert ccr_key(original) == key
    for old, new in sent.changed_pairs:
        if new.kind is Kind.TOOL_RESULT:
            keys = marker_keys(new.text)
            assert new.text.startswith("[deep-memory: ") and keys, new.text[:200]
            assert originals[keys[0]] == old.text
            assert store.get(keys[0]) == utf8(old.text)
        elif new.kind is Kind.TEXT and new.role is Role.USER:
            assert marker_keys(new.text), f"{describe(new)} changed without a marker"
            assert expand_inline(new.text, originals) == old.text
        else:  # the one deliberate loss: <think> blocks in assistant text of older turns
            assert new.kind is Kind.TEXT and new.role is Role.ASSISTANT, describe(new)
            assert old.message < sent.live_start and "<think" in old.text, describe(new)
    for item in sent.after.items:
        for key in marker_keys(item.text):
            stored = store.get(key)
            assert stored is not None, f"marker key {key} of {describe(item)} is not stored"
            assert ccr_key(stored.decode("utf-8", "surrogatepass")) == key


# The generated tools whose outputs are logs or listings (pytest, make, find; glob): the kinds
# compressed on arrival. File views, grep output, JSON and reports never are.
ARRIVAL_TOOLS = frozenset({"bash", "glob"})


def check_live_turn(sent: Sent, options: CompressionSettings) -> None:
    """Property 2: the live turn byte for byte, except older tool results of the live turn
    (when ``compress_live_turn``) and latest-step results compressed on arrival."""
    latest = sent.boundary.latest_calls
    for old, new in sent.alignment.pairs:
        is_result = old.kind is Kind.TOOL_RESULT
        if is_result and old.call_id in latest:
            if dumps(old.value) != dumps(new.value):
                assert options.arrival_kinds, f"latest-step {describe(old)} changed"
                assert old.tool_name in ARRIVAL_TOOLS, f"latest-step {describe(old)} changed"
                assert estimate_tokens(old.text) >= options.arrival_tokens, describe(old)
                assert new.text.startswith("[deep-memory: ") and marker_keys(new.text)
                assert sent.result.originals[marker_keys(new.text)[0]] == old.text
            continue
        if old.message < sent.live_start:
            continue
        if is_result and options.compress_live_turn:
            continue
        assert dumps(old.value) == dumps(new.value), f"live-turn {describe(old)} changed"
    if not options.compress_live_turn:
        key = list_key(sent.dialect)
        live_in = sent.request[key][sent.live_start :]
        live_out = sent.body[key][output_index(sent, sent.live_start) :]
        assert dumps(live_out) == dumps(live_in)


def total_tokens(conversation: Conversation) -> int:
    return sum(estimate_tokens(item.text) for item in conversation.items)


def head(dialect: Dialect, body: JsonObject, first_user: int) -> bytes:
    key = list_key(dialect)
    top = {k: body.get(k) for k in ("system", "instructions")}
    return dumps([top, body[key][: first_user + 1]])


def first_user_message(conversation: Conversation) -> int:
    return next(
        i.message for i in conversation.items if i.role is Role.USER and i.kind is Kind.TEXT
    )


def sent_forms(sent: Sent) -> dict[int, bytes]:
    """Each input message (by its index in the client's list) as it was sent upstream, but
    for Anthropic's cache marks, which the client moves (a provider's cached prefix is the
    same without them)."""
    key = list_key(sent.dialect)
    gone = {item.message for item in sent.alignment.dropped}
    forms = {}
    for index in range(len(sent.request[key])):
        if sent.dialect is Dialect.OPENAI_RESPONSES and index in gone:
            continue
        forms[index] = dumps(without_cache_marks(sent.body[key][output_index(sent, index)]))
    return forms


# --- minimal sessions that showed bugs these properties found; replayed on every run --------

LOG = build_log(200, ["config", "parser"], [])  # a build log of ~2,300 tokens
READ = ToolCall("read", {"filePath": "/repo/a.py"}, file_view("/repo/a.py", 150, ["a", "b"], []))
LS = ToolCall("bash", {"command": "ls"}, "README.md\nsrc")
LS_LA = ToolCall("bash", {"command": "ls -la"}, "total 0")


def step(*calls: ToolCall, think: Reasoning | None = None) -> Step:
    return Step(think, None, calls)


def agent_session(*turns: Turn) -> Session:
    return Session("You are an agent.", turns)


# Bugs fixed in 705d897 are noted "was"; the open one "is".
#
# The agent reads a file, runs ls (the read leaves the protected tail and is compressed), ends
# the turn; the next turn reads the same file again. Was: the re-read, in the latest step, was
# sent in the earlier copy's compressed form. Is: resending the compressed request compresses
# the re-read.
REREAD = agent_session(
    Turn("Fix a.py", (step(READ), step(LS)), Answer(None, "done")),
    Turn("Look at a.py again", (step(READ),), None),
)
# The same file read twice in a row, then ls. Was: the second copy, sent in full while it was
# the latest step, took the first copy's compressed form on the next request, without an event.
READ_TWICE = agent_session(Turn("Fix a.py", (step(READ), step(READ), step(LS)), None))
# Two identical outputs compressed in one rewrite (parallel calls; also any pressure event).
# Was: the dedup pointer replaced the shared decision, so the first copy became a pointer too.
TWIN_READS = agent_session(Turn("Fix a.py", (step(READ, READ), step(LS), step(LS_LA)), None))
# A step with reasoning in turn 1, then turn 2 begins. Was: the reasoning was dropped with
# ``result.event`` None (nothing was pending, so no event was counted).
REASONING_THEN_NEW_TURN = agent_session(
    Turn("List files", (step(LS, think=Reasoning("plan", "c2ln")),), Answer(None, "done")),
    Turn("Thanks, next", (), None),
)
# OpenCode puts <system-reminder> blocks into user messages, the first one included. Was: the
# head's reminder was replaced by a marker once turn 2 began.
REMINDER_IN_FIRST_MESSAGE = agent_session(
    Turn("Fix it\n\n" + reminder("x"), (step(LS),), Answer(None, "done")),
    Turn("next", (), None),
)
# An older output compressed, then the compressed request sent again. Was: the compressed text
# (marker and all) was compressed again.
COMPRESSED_THEN_ECHOED = agent_session(
    Turn("Fix the build", (step(ToolCall("bash", {}, LOG)), step(LS)), None)
)


# --- the properties ------------------------------------------------------------------------


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_tool_calls_stay_paired_and_only_old_reasoning_vanishes(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 1: every call and result keeps its id and place; no message, block or item
    vanishes but reasoning of older turns, dropped whole; everything but item texts (ids,
    signatures, encrypted_content, unknown keys, key order) is byte-identical."""
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            check_paired_and_whole(sent)


@PROPERTY
@given(sessions(), st.booleans(), colds)
@example(REREAD, True, [])
def test_live_turn_byte_identical_and_latest_step_untouched(
    session: Session, live_compression: bool, cold_flags: list[bool]
) -> None:
    """Property 2, strict: nothing compressed on arrival, so the latest step's results and every
    text, reasoning and tool call from the last real user message on are byte-identical."""
    options = CompressionSettings(arrival_kinds=frozenset(), compress_live_turn=live_compression)
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            check_live_turn(sent, options)


@PROPERTY
@given(sessions(), colds)
@example(REREAD, [])
def test_live_turn_with_arrival_compression(session: Session, cold_flags: list[bool]) -> None:
    """Property 2 with arrival compression: a latest-step result may change only if it is a huge
    log or listing, and then it carries a marker whose original is the output."""
    options = CompressionSettings()  # huge listings and logs compressed on arrival
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            check_live_turn(sent, options)


@PROPERTY
@given(sessions(), settings_strategy, colds)
@example(REREAD, STRICT, [])
def test_strict_live_turn_keeps_everything_from_the_last_user_message(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 2 with ``compress_live_turn=False``: the tail from the last user message on is
    byte-identical, whole messages compared."""
    options = CompressionSettings(
        tail_tokens=options.tail_tokens,
        pressure_thresholds=options.pressure_thresholds,
        arrival_kinds=options.arrival_kinds,
        compress_live_turn=False,
    )
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            check_live_turn(sent, options)


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_every_marker_expands_to_the_exact_original(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 3: every marker's key expands (from ``result.originals`` and an OriginalStore)
    to exactly the text it replaced; dedup pointers to the duplicated output."""
    for rendered in renderings(session):
        store = OriginalStore(open_database(None))
        for sent, _ in replay(rendered, options, cold_flags):
            store.put_many(sent.result.originals)
            check_markers(sent, store)


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_deterministic(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 4a: a session replayed twice with fresh memos gives the same bytes."""
    for rendered in renderings(session):
        first = [dumps(sent.body) for sent, _ in replay(rendered, options, cold_flags)]
        second = [dumps(sent.body) for sent, _ in replay(rendered, options, cold_flags)]
        assert first == second
        last = rendered.boundaries[-1]
        alone = [dumps(send(rendered, last, SessionMemo(), options).body) for _ in range(2)]
        assert alone[0] == alone[1]


HASH_SEED_SCRIPT = """
import hashlib, sys, orjson
from compressors.pipeline import CompressionSettings, SessionMemo, compress
from compressors.view import Dialect
from compressors.wire import parse_conversation
for line in sys.stdin.buffer:
    dialect, body = orjson.loads(line)
    compress(parse_conversation(Dialect(dialect), body), SessionMemo(), CompressionSettings())
    print(hashlib.sha256(orjson.dumps(body)).hexdigest())
"""


def output_grid() -> list[ToolCall]:
    """Every kind of generated output, in several sizes and vocabularies."""
    calls = []
    for count in (100, 300, 700):
        for names in (["config", "parser"], ["router", "cache", "stream"], list(WORDS[:5])):
            calls += [
                ToolCall("read", {"filePath": "/r/a.py"}, file_view("/r/a.py", count, names, [])),
                ToolCall("bash", {"command": "pytest"}, unit_test_log(count, 3, names, [])),
                ToolCall("bash", {"command": "make"}, build_log(count, names, [])),
                ToolCall("grep", {"pattern": "x"}, grep_output(count, names, [])),
                ToolCall("glob", {"pattern": "**/*.py"}, path_listing(count, names, [])),
                ToolCall("issues", {}, json_array(count, names, ["a"], True)),
                ToolCall("task", {}, report(count // 4, names, [])),
            ]
    return calls


def test_same_output_in_every_process() -> None:
    """Determinism across processes: a restarted proxy (or ``deepmem replay``) must compress
    the same request to the same bytes, whatever the interpreter's hash seed."""
    lines = []
    for call in output_grid():
        rendered = render(
            Session("s", (Turn("task", (step(call), step(LS)), None),)), Dialect.OPENAI_CHAT
        )
        lines.append(dumps([rendered.dialect.value, rendered.request(rendered.boundaries[-1])]))
    stdin = b"\n".join(lines)
    digests = []
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", HASH_SEED_SCRIPT],
            input=stdin,
            capture_output=True,
            env=env,
            cwd=ROOT,
            check=True,
            timeout=120,
        )
        digests.append(done.stdout.split())
    assert len(digests[0]) == len(lines)
    assert digests[0] == digests[1] == digests[2]


@PROPERTY
@given(sessions(), settings_strategy)
@example(COMPRESSED_THEN_ECHOED, CompressionSettings())
@example(REREAD, CompressionSettings())
def test_idempotent(session: Session, options: CompressionSettings) -> None:
    """Property 4b: sending the compressed request again (same memo) changes nothing."""
    for rendered in renderings(session):
        for sent, memo in replay(rendered, options):
            if sent.result.counters["deferred"]:
                continue  # the work cap left outputs for the next request: a resend does them
            again = send(rendered, sent.boundary, copy.deepcopy(memo), options, request=sent.body)
            for old, new in again.alignment.pairs:
                assert old.text == new.text, f"{describe(old)} compressed again"
            assert dumps(again.body) == dumps(sent.body)


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_never_inflates(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 5: no item's text grows; the request's token estimate never grows."""
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            for old, new in sent.alignment.pairs:
                assert len(new.text) <= len(old.text), f"{describe(old)} grew"
                assert estimate_tokens(new.text) <= estimate_tokens(old.text), describe(old)
            assert total_tokens(sent.after) <= total_tokens(sent.before)


@PROPERTY
@given(sessions(), settings_strategy, colds)
@example(REMINDER_IN_FIRST_MESSAGE, CompressionSettings(), [])
def test_head_never_changes(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 6a: the system prompt and the first user message are never changed."""
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            first = first_user_message(sent.before)
            assert head(sent.dialect, sent.body, first) == head(sent.dialect, sent.request, first)


@PROPERTY
@given(sessions(), settings_strategy, colds)
@example(REASONING_THEN_NEW_TURN, CompressionSettings(), [])
@example(TWIN_READS, CompressionSettings(), [])
@example(REMINDER_IN_FIRST_MESSAGE, CompressionSettings(), [])
@example(READ_TWICE, STRICT, [])
def test_cache_safe_across_a_session(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    """Property 6b: a message keeps the form it was first sent in, unless the request that
    changes it reports an event."""
    for rendered in renderings(session):
        previous: dict[int, bytes] | None = None
        for sent, _ in replay(rendered, options, cold_flags):
            forms = sent_forms(sent)
            if previous is not None and sent.result.event is None:
                for index, form in previous.items():
                    assert forms.get(index) == form, (
                        f"{sent.dialect}: message {index} changed without an event "
                        f"(request of {sent.boundary.end} messages)"
                    )
            previous = forms


# --- the proxy hook: hostile bodies fail open ----------------------------------------------


@pytest.fixture(scope="module")
def transforms() -> Iterator[list[Addon]]:
    with tempfile.TemporaryDirectory() as data_dir:
        proxy_settings = load_settings({"data_dir": data_dir}, environ={})
        stores: Stores = open_stores(proxy_settings, in_memory=True)
        yield build_addons(proxy_settings, stores)


def check_rewrite(raw: bytes, dialect: Dialect, rewrite: Rewrite) -> None:
    if rewrite.outcome == Outcome.REWRITTEN:
        original = orjson.loads(raw)  # only valid JSON (UTF-8, no lone surrogates) is rewritten
        body = orjson.loads(rewrite.body)  # into a valid body of the same dialect, ...
        assert sorted(body) == sorted(original)
        key = list_key(dialect)
        if dialect is not Dialect.OPENAI_RESPONSES:
            assert len(body[key]) == len(original[key])
        # ... whose every item is still there (only old reasoning may be gone)
        align(parse_conversation(dialect, original), parse_conversation(dialect, body))
    else:
        assert rewrite.body == raw, rewrite.outcome
    assert rewrite.outcome in {
        Outcome.FORWARDED,
        Outcome.REWRITTEN,
        Outcome.NOT_JSON,
        Outcome.NOT_CHAT,
        Outcome.FAILED_OPEN,
    }


def hook(raw: bytes, dialect: Dialect, transforms: list[Addon], session: str) -> Rewrite:
    rewrite = rewrite_request(raw, dialect, {"x-session-id": session}, transforms)
    check_rewrite(raw, dialect, rewrite)
    return rewrite


WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just({"type": "text"}),
    st.just([{"type": "tool_result"}]),
)


def json_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from json_paths(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from json_paths(child, (*path, index))


def replace_at(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    holder = body
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return body


@st.composite
def hostile_bodies(draw: st.DrawFn) -> tuple[Dialect, bytes]:
    rendered = render(draw(sessions(max_turns=2)), draw(st.sampled_from(list(Dialect))))
    body: Any = rendered.request(rendered.boundaries[-1])
    paths = list(json_paths(body))
    for _ in range(draw(st.integers(0, 4))):
        path = paths[draw(st.integers(0, len(paths) - 1))]
        value = copy.deepcopy(draw(WRONG_VALUES))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # an earlier one cut the path
            body = replace_at(body, path, value)
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()  # big ints too
    damage = draw(st.sampled_from(["none", "none", "bytes", "surrogate", "truncate"]))
    at = draw(st.integers(0, len(raw)))
    if damage == "bytes":
        raw = raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + raw[at:]
    elif damage == "surrogate":
        raw = raw.replace(b'"content":"', b'"content":"\\ud800', 1)
    elif damage == "truncate":
        raw = raw[:at]
    return rendered.dialect, raw


@settings(PROPERTY, max_examples=60)
@given(hostile_bodies())
def test_proxy_hook_fails_open_on_mutated_bodies(
    transforms: list[Addon], case: tuple[Dialect, bytes]
) -> None:
    """Property 7: mutated bodies (wrong types anywhere, big integers, invalid UTF-8, escaped
    lone surrogates, truncation) through the real stage: the hook never raises and returns
    the original bytes or a valid rewrite."""
    dialect, raw = case
    hook(raw, dialect, transforms, "hostile")


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def chat_body(content: Any, **extra: Any) -> JsonObject:
    """A chat body whose older tool result is ``content``."""
    return {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{not json"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": content},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "b", "function": {"name": "ls", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "b", "content": "x"},
        ],
        "tools": [{"type": "function", "function": {"name": "bash"}}],
        **extra,
    }


TEN_MB_LINE = "x" * 10_000_000
EXTREME: list[tuple[str, Dialect, bytes]] = [
    ("invalid utf-8", Dialect.OPENAI_CHAT, b'{"messages":[{"role":"user","content":"\xff\xfe"}]}'),
    ("lone surrogate", Dialect.ANTHROPIC, b'{"messages":[{"role":"user","content":"\\ud800"}]}'),
    ("nested 5000", Dialect.OPENAI_CHAT, b'{"messages":' + nested(5000) + b"}"),
    (
        "nested 900 extra",
        Dialect.OPENAI_CHAT,
        dumps(chat_body(LOG))[:-1] + b',"x":' + nested(900) + b"}",
    ),
    ("malformed", Dialect.OPENAI_RESPONSES, b'{"input":[{"type":"function_call_output",'),
    ("empty", Dialect.ANTHROPIC, b""),
    ("not an object", Dialect.OPENAI_CHAT, b"[1,2,3]"),
    ("messages as dict", Dialect.OPENAI_CHAT, dumps({"messages": {"role": "user"}})),
    ("content as number", Dialect.ANTHROPIC, dumps({"messages": [{"role": "user", "content": 7}]})),
    (
        "tool_calls as string",
        Dialect.OPENAI_CHAT,
        dumps(
            {
                "messages": [
                    {"role": "user", "content": "u"},
                    {"role": "assistant", "tool_calls": "x"},
                ]
            }
        ),
    ),
    (
        "tool_result content as dict",
        Dialect.ANTHROPIC,
        dumps(
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": {}}]}]}
        ),
    ),
    (
        "output as list of numbers",
        Dialect.OPENAI_RESPONSES,
        dumps({"input": [{"type": "function_call_output", "output": [1, 2]}]}),
    ),
    ("input as number", Dialect.OPENAI_RESPONSES, dumps({"input": 3.5})),
    ("10 MB line", Dialect.OPENAI_CHAT, dumps(chat_body(TEN_MB_LINE))),
    ("nested json text", Dialect.OPENAI_CHAT, dumps(chat_body(nested(5000).decode()))),
    ("nested json text 900", Dialect.OPENAI_CHAT, dumps(chat_body(nested(900).decode()))),
    (
        "deep tool input",
        Dialect.ANTHROPIC,
        b'{"messages":[{"role":"user","content":"u"},'
        b'{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"bash","input":'
        + nested(600)
        + b"}]}]}",
    ),
]


@pytest.mark.parametrize(("dialect", "raw"), [c[1:] for c in EXTREME], ids=[c[0] for c in EXTREME])
def test_proxy_hook_fails_open_on_extreme_bodies(
    transforms: list[Addon], dialect: Dialect, raw: bytes
) -> None:
    hook(raw, dialect, transforms, "extreme")


def test_ten_megabyte_output_is_compressed_not_failed(transforms: list[Addon]) -> None:
    rewrite = hook(dumps(chat_body(TEN_MB_LINE)), Dialect.OPENAI_CHAT, transforms, "big")
    assert rewrite.outcome == Outcome.REWRITTEN
    assert len(rewrite.body) < 1_000_000


# Beyond 64 bits: orjson reads it as a float. Was: a rewrite sent 1.2345678901234568e+29.
BIG_INT = 123456789012345678901234567890


@st.composite
def bodies_with_numbers(draw: st.DrawFn) -> tuple[Dialect, bytes]:
    """A session's last request carrying numbers in fields the proxy must not touch."""
    rendered = render(draw(sessions(min_turns=2)), draw(st.sampled_from(list(Dialect))))
    body = rendered.request(rendered.boundaries[-1])
    numbers = st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    body["metadata"] = {"numbers": draw(st.lists(numbers, min_size=1, max_size=4))}
    return rendered.dialect, json.dumps(body, separators=(",", ":")).encode()


@PROPERTY
@given(bodies_with_numbers())
@example(
    (Dialect.OPENAI_CHAT, json.dumps(chat_body(LOG, metadata={"numbers": [BIG_INT]})).encode())
)
def test_rewrite_keeps_untouched_numbers_exact(
    transforms: list[Addon], case: tuple[Dialect, bytes]
) -> None:
    dialect, raw = case
    rewrite = hook(raw, dialect, transforms, "numbers")
    exact = json.loads(rewrite.body)["metadata"]  # the stdlib keeps every integer exact
    assert json.dumps(exact) == json.dumps(json.loads(raw)["metadata"])


# --- memory injection through the whole hook ------------------------------------------------

MEMORY_MD = (
    "## Constraints\n\n- Never edit the generated parser tables\n\n## Decisions\n\n"
    + "".join(
        f"- The {word} module keeps its own cache of {other} objects [2026-0{1 + n % 9}-1{n % 9}]\n"
        for n, (word, other) in enumerate(zip(WORDS, reversed(WORDS), strict=False))
    )
)


@pytest.fixture(scope="module")
def memory_hook() -> Iterator[tuple[list[Addon], str]]:
    with tempfile.TemporaryDirectory() as root:
        project = os.path.join(root, "project")
        os.makedirs(os.path.join(project, ".deep-memory"))
        with open(os.path.join(project, ".deep-memory", "MEMORY.md"), "w") as handle:
            handle.write(MEMORY_MD)
        proxy_settings = load_settings(
            {"data_dir": os.path.join(root, "data"), "allowed_roots": root}, environ={}
        )
        stores = open_stores(proxy_settings, in_memory=True)
        yield build_addons(proxy_settings, stores, memory_service(proxy_settings)), project


@PROPERTY
@given(session=sessions())
def test_injection_is_appended_once_and_resent_byte_for_byte(
    session: Session,
    memory_hook: tuple[list[Addon], str],
    transforms: list[Addon],
) -> None:
    """Invariant 6 for memory. The same requests go through the compression-only hook and the
    full one (its own stores, same session): the full one's system prompt and user messages
    are the compression-only ones plus an appended suffix, and each suffix, once sent, is sent
    again byte for byte on every later request."""
    with_memory, project = memory_hook
    for rendered in renderings(session):
        headers = {
            "x-session-id": f"prop-{rendered.dialect}-{os.urandom(6).hex()}",
            "X-Deep-Memory-Project": project,
        }
        system_suffix: str | None = None
        suffixes: list[str] = []  # what the k-th user message got appended, when first sent
        for boundary in rendered.boundaries:
            raw = dumps(rendered.request(boundary))
            plain = rewrite_request(raw, rendered.dialect, headers, transforms)
            full = rewrite_request(raw, rendered.dialect, headers, with_memory)
            assert full.outcome in (Outcome.FORWARDED, Outcome.REWRITTEN), full.error
            base = parse_conversation(rendered.dialect, orjson.loads(plain.body))
            sent = parse_conversation(rendered.dialect, orjson.loads(full.body))
            for kind in (Kind.TOOL_CALL, Kind.TOOL_RESULT):  # pairing kept; text parts may be new
                assert [i.call_id for i in sent.items if i.kind is kind] == [
                    i.call_id for i in base.items if i.kind is kind
                ]
            assert sent.system_text.startswith(base.system_text)
            suffix = sent.system_text[len(base.system_text) :]
            system_suffix = suffix if system_suffix is None else system_suffix
            assert suffix == system_suffix, "the stable block changed within the session"
            forms = [text for _, text in sent.user_messages()]
            bases = [text for _, text in base.user_messages()]
            assert len(forms) == len(bases)
            for k, (form, plain_form) in enumerate(zip(forms, bases, strict=True)):
                assert form.startswith(plain_form)
                added = form[len(plain_form) :]
                assert added.count("<deep-memory-context") <= 1
                if k < len(suffixes):
                    assert added == suffixes[k], f"user message {k} changed its injected text"
                else:
                    suffixes.append(added)
        assert system_suffix, f"{rendered.dialect}: no stable block was injected"
