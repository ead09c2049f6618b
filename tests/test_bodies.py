"""The body cache: a session's request parsed from where it differs from the previous one gives
the value a whole parse gives, the kept objects are never edited, and the rewrite forwards the
same bytes with or without it."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from compressors.view import Dialect, EditMemo
from compressors.wire import FORMATS, parse_conversation
from proxy import bodies as bodies_module
from proxy.addons import build_addons
from proxy.bodies import BodyCache, write
from proxy.config import load_settings
from proxy.flow import Addon
from proxy.memory_api import memory_service
from proxy.pipeline import Read, Rewrite, rewrite_request
from proxy.stores import open_stores
from tests.addons import Hook
from tests.strategies import Session, renderings, sessions, with_cache_marks
from tests.test_properties import MEMORY_MD, PROPERTY

CHAT = FORMATS[Dialect.OPENAI_CHAT]
ANTHROPIC = FORMATS[Dialect.ANTHROPIC]
KEY = ("ses_1", "openai-chat")


def chat(messages: list[Any], **extra: Any) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, "tools": [{"x": 1}], **extra})


def turn(n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for i in range(n):
        messages.append({"role": "user", "content": f"question {i} é 🙂"})
        messages.append({"role": "assistant", "content": f"answer {i}", "n": 1.5e300})
    return messages


def test_a_longer_request_reuses_every_message_it_repeats() -> None:
    bodies = BodyCache()
    first = chat(turn(2))
    parsed = bodies.parse(KEY, CHAT, first)
    assert parsed.reused == 0 and parsed.body == orjson.loads(first)
    bodies.remember(KEY, first, parsed)
    second = chat(turn(4))
    again = bodies.parse(KEY, CHAT, second)
    assert again.reused == 5 and again.body == orjson.loads(second)
    assert all(a is b for a, b in zip(again.body["messages"], parsed.messages[:5], strict=False))
    assert bodies.hits == 1


def test_moved_cache_marks_and_a_rewritten_message_reuse_only_what_precedes_them() -> None:
    bodies = BodyCache()
    messages = [{"role": "user", "content": [{"type": "text", "text": f"m{i}"}]} for i in range(6)]
    marked = [*messages[:4], *({**m, "cache_control": {"type": "ephemeral"}} for m in messages[4:])]
    first = orjson.dumps({"model": "m", "system": "s", "messages": marked})
    kept = bodies.parse(("s", "a"), ANTHROPIC, first)
    bodies.remember(("s", "a"), first, kept)
    longer = [*messages, *({**m, "cache_control": {"type": "ephemeral"}} for m in messages[4:])]
    second = orjson.dumps({"model": "m", "system": "s", "messages": longer})
    growth = bodies.growth(("s", "a"), second)
    assert growth is not None and growth.added == len(second) - len(first)  # not the resent
    parsed = bodies.parse(("s", "a"), ANTHROPIC, second)
    assert parsed.reused == 4 and parsed.body == orjson.loads(second)
    # The two it sends again lost their marks (the new last two have them): nothing new.
    assert parsed.alike == 2
    # Not parsed again: the kept objects without their marks, sharing what the marks left.
    for index in (4, 5):
        again = parsed.body["messages"][index]
        assert again is not kept.messages[index] and "cache_control" in kept.messages[index]
        assert again["content"] is kept.messages[index]["content"]
    assert write(parsed, ANTHROPIC) == second
    bodies.remember(("s", "a"), second, parsed)
    edited = [*longer[:2], {"role": "user", "content": "changed"}, *longer[3:]]
    third = orjson.dumps({"model": "m", "system": "s", "messages": edited})
    parsed = bodies.parse(("s", "a"), ANTHROPIC, third)
    assert parsed.reused == 2 and parsed.body == orjson.loads(third)
    assert parsed.alike == 0  # the message after the repeated ones is another text
    shorter = orjson.dumps({"model": "m", "system": "s", "messages": edited[:1]})
    assert bodies.parse(("s", "a"), ANTHROPIC, shorter).body == orjson.loads(shorter)


def test_moved_marks_found_ahead_are_not_looked_for_again(monkeypatch) -> None:
    """Once the answer is out, the kept body's last messages are read for their cache marks
    (``read_ahead``): the next body's hint and parse compare the bytes once, up to the first
    marked message and then only that message, and take the messages without their marks
    as found then. The parse is the one a body cache that read nothing ahead gives."""
    mark = {"type": "ephemeral"}
    messages = [{"role": "user", "content": [{"type": "text", "text": f"m{i}"}]} for i in range(6)]
    marked = [*messages[:4], *({**m, "cache_control": mark} for m in messages[4:])]
    first = orjson.dumps({"model": "m", "system": "s", "messages": marked})
    longer = [*messages, *({**m, "cache_control": mark} for m in messages[4:])]
    second = orjson.dumps({"model": "m", "system": "s", "messages": longer})
    plain, read = BodyCache(), BodyCache()
    plain.remember(KEY, first, plain.parse(KEY, ANTHROPIC, first))
    read_ahead = read.remember(KEY, first, read.parse(KEY, ANTHROPIC, first))
    assert read_ahead is not None
    read_ahead()
    expected = plain.parse(KEY, ANTHROPIC, second)
    unmarked: list[Any] = []
    compared: list[int] = []
    monkeypatch.setattr(
        bodies_module, "without_cache_marks", lambda value: unmarked.append(value) or value
    )

    class Compared(bytes):
        def startswith(self, prefix: Any, *start: Any) -> bool:
            compared.append(len(prefix))
            return super().startswith(prefix, *start)

    got = read.parse(KEY, ANTHROPIC, Compared(second))
    assert unmarked == []
    assert (got.body, got.reused, got.alike, got.ends) == (
        expected.body,
        expected.reused,
        expected.alike,
        expected.ends,
    )
    kept = read._kept[KEY]
    assert kept.marks is not None and kept.marks.marked_from == 4
    resent = [kept.marks.unmarked[index] for index in (4, 5)]
    runs = [end - begin for u in resent if u is not None for begin, end in u.runs]
    # The repeated messages' bytes once, each resent one's bytes between its marks (the kept
    # body's, not a copy), then the new messages' (where each ends: ``_locate``).
    assert compared == [kept.ends[3], *runs, *compared[-2:]] and len(runs) == 4
    for message in resent:
        assert message is not None
        unmarked = b"".join(first[begin:end] for begin, end in message.runs)
        assert len(unmarked) == message.size and b"cache_control" not in unmarked


@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    changed=st.lists(st.integers(0, 11), max_size=3),
    added=st.integers(0, 2),
    marked_from=st.one_of(st.none(), st.integers(0, 12)),
)
def test_the_messages_a_body_repeats_are_counted_whatever_the_guess(
    sizes: list[int], changed: list[int], added: int, marked_from: int | None
) -> None:
    """``_repeated`` against its definition: the largest count of the kept body's first
    messages that the new body repeats byte for byte (a message and the comma or bracket
    after it), whichever first guess ``marked_from`` makes it try."""
    messages = [{"role": "user", "content": "x" * size} for size in sizes]
    raw = orjson.dumps({"model": "m", "messages": messages})
    bodies = BodyCache()
    bodies.remember(KEY, raw, bodies.parse(KEY, ANTHROPIC, raw))
    kept = bodies._kept[KEY]
    if marked_from is not None:
        kept.marks = bodies_module._LastMarks({}, min(marked_from, len(messages)))
    now = [
        dict(m, content=m["content"] + "!") if i in changed else m for i, m in enumerate(messages)
    ]
    now += [{"role": "user", "content": "new"}] * added
    new = orjson.dumps({"model": "m", "messages": now})

    def repeats(count: int) -> bool:
        end = kept.ends[count - 1] if count else 0
        return new[:end] == raw[:end] and (count == 0 or new[end : end + 1] in (b",", b"]"))

    expected = max(count for count in range(len(messages) + 1) if repeats(count))
    assert bodies_module._repeated(kept, new) == expected


def test_marks_taken_out_of_a_message_that_also_changed_are_parsed_as_it_is_now() -> None:
    bodies, key = BodyCache(), ("s", "a")
    mark = {"type": "ephemeral"}
    question = {"role": "user", "content": "q"}

    def body(*blocks: dict[str, Any]) -> bytes:
        reply = {"role": "assistant", "content": list(blocks)}
        return orjson.dumps({"model": "m", "messages": [question, reply, question]})

    first = body(
        {"type": "text", "text": "kept"}, {"type": "text", "text": "old", "cache_control": mark}
    )
    bodies.remember(key, first, bodies.parse(key, ANTHROPIC, first))
    second = body({"type": "text", "text": "kept"}, {"type": "text", "text": "new"})
    parsed = bodies.parse(key, ANTHROPIC, second)  # its mark out, and another text
    assert parsed.reused == 1 and parsed.alike == 0 and parsed.body == orjson.loads(second)
    third = body(
        {"type": "text", "text": "kept", "cache_control": mark}, {"type": "text", "text": "old"}
    )
    parsed = bodies.parse(key, ANTHROPIC, third)  # its mark moved within it: alike, parsed anew
    assert parsed.reused == 1 and parsed.alike == 2 and parsed.body == orjson.loads(third)
    assert write(parsed, ANTHROPIC) == third


@pytest.mark.parametrize(
    "raw",
    [
        # spaces: not what orjson writes, so where a message ends cannot be found
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        # a look-alike of the message list inside an earlier value
        b'{"meta":{"messages":[{"role":"user","content":"hi"}]},"messages":'
        b'[{"role":"user","content":"hi"}]}',
        # an integer orjson cannot hold
        b'{"messages":[{"role":"user","content":"hi","n":123456789012345678901}]}',
    ],
)
def test_bodies_it_cannot_place_exactly_are_parsed_whole_and_not_kept(raw: bytes) -> None:
    bodies = BodyCache()
    parsed = bodies.parse(KEY, CHAT, raw)
    assert parsed.body == __import__("json").loads(raw) and parsed.start == -1
    bodies.remember(KEY, raw, parsed)
    assert len(bodies) == 0


def test_a_longer_body_with_an_unholdable_integer_in_its_new_part_is_parsed_whole() -> None:
    bodies = BodyCache()
    first = chat(turn(1))
    bodies.remember(KEY, first, bodies.parse(KEY, CHAT, first))
    second = chat([*turn(1), {"role": "user", "content": "x", "n": 1}]).replace(
        b'"n":1}', b'"n":123456789012345678901}'
    )
    parsed = bodies.parse(KEY, CHAT, second)
    assert parsed.exact and parsed.body["messages"][-1]["n"] == 123456789012345678901


def test_memory_is_bounded() -> None:
    bodies = BodyCache(max_sessions=2, max_bytes=10_000)
    for n in range(4):
        raw = chat(turn(3))
        bodies.remember((f"s{n}", "c"), raw, bodies.parse((f"s{n}", "c"), CHAT, raw))
    assert len(bodies) == 2 and bodies.bytes == 2 * len(chat(turn(3)))
    big = chat(turn(1), pad="x" * 20_000)
    bodies.remember(("big", "c"), big, bodies.parse(("big", "c"), CHAT, big))
    assert ("big", "c") not in bodies._kept


def test_the_members_after_the_messages_are_taken_again_while_their_bytes_repeat() -> None:
    """OpenCode sends its tool schemas after the messages: a step that repeats their bytes
    takes the parsed members again (and its write their bytes), and the value is a whole
    parse's; members that changed, or that the format edits, are parsed again."""
    bodies = BodyCache()
    tools = [{"type": "function", "function": {"name": f"t{i}", "x": [i] * 20}} for i in range(9)]
    first = orjson.dumps({"model": "m", "messages": turn(2), "tools": tools, "stream": True})
    parsed = bodies.parse(KEY, CHAT, first)
    assert parsed.tail == {"tools": tools, "stream": True}
    bodies.remember(KEY, first, parsed)
    second = orjson.dumps({"model": "m", "messages": turn(3), "tools": tools, "stream": True})
    again = bodies.parse(KEY, CHAT, second)
    assert again.body == orjson.loads(second) and list(again.body) == list(orjson.loads(second))
    assert again.body["tools"] is parsed.body["tools"] and again.tail is parsed.tail
    bodies.remember(KEY, second, again)
    changed = [*tools[:-1], {"type": "function", "function": {"name": "new"}}]
    third = orjson.dumps({"model": "m", "messages": turn(4), "tools": changed, "stream": True})
    fresh = bodies.parse(KEY, CHAT, third)
    assert fresh.reused > 0 and fresh.body == orjson.loads(third)
    assert fresh.body["tools"] is not parsed.body["tools"]
    # Anthropic's system prompt is edited in place by the view: never taken again.
    key = ("s", "a")
    system = [{"type": "text", "text": "sys"}]
    one = orjson.dumps({"model": "m", "messages": turn(1)[1:], "system": system, "tools": tools})
    kept = bodies.parse(key, ANTHROPIC, one)
    assert kept.tail is None
    bodies.remember(key, one, kept)
    two = orjson.dumps({"model": "m", "messages": turn(2)[1:], "system": system, "tools": tools})
    other = bodies.parse(key, ANTHROPIC, two)
    assert other.reused > 0 and other.body == orjson.loads(two)
    assert other.body["system"] is not kept.body["system"]


# --- writing a rewritten body ----------------------------------------------------------------


def _written_with_what_it_serialised(
    parsed: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[bytes | None, list[Any]]:
    """``write(parsed, CHAT)``, and every value it handed to orjson to serialise."""
    serialised: list[Any] = []
    original = orjson.dumps

    def dumps(value: Any) -> bytes:
        serialised.append(value)
        return original(value)

    monkeypatch.setattr(bodies_module.orjson, "dumps", dumps)
    data = write(parsed, CHAT)
    monkeypatch.undo()
    return data, serialised


def test_a_body_of_repeated_members_after_its_messages_is_written_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bodies = BodyCache()
    tools = [{"name": f"t{i}"} for i in range(5)]
    first = orjson.dumps({"model": "m", "messages": turn(2), "tools": tools})
    parsed = bodies.parse(KEY, CHAT, first)
    assert write(parsed, CHAT) == first
    bodies.remember(KEY, first, parsed)
    second = orjson.dumps({"model": "m", "messages": turn(3), "tools": tools})
    parsed = bodies.parse(KEY, CHAT, second)
    data, serialised = _written_with_what_it_serialised(parsed, monkeypatch)
    assert data == second
    assert not any(value is parsed.body["tools"] for value in serialised)
    parsed.body["tools"] = [*tools, {"name": "added"}]  # replaced: written again
    assert write(parsed, CHAT) == orjson.dumps(parsed.body)


def _edited(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "content": "[cut]"}


def test_a_rewritten_body_is_written_as_a_whole_dumps_would_and_reuses_what_it_forwarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bodies = BodyCache()
    first = chat(turn(3), stream=True)
    parsed = bodies.parse(KEY, CHAT, first)
    messages = parsed.body["messages"]
    messages[2] = cut = _edited(messages[2])  # what the view does: a copy, never in place
    assert write(parsed, CHAT) == orjson.dumps(parsed.body)
    bodies.remember(KEY, first, parsed)
    assert bodies.bytes == len(first) + len(orjson.dumps(parsed.body))

    second = chat(turn(4), stream=True)
    parsed = bodies.parse(KEY, CHAT, second)
    parsed.body["messages"][2] = cut  # the same edit gives the same object again
    parsed.body["messages"][5] = _edited(parsed.body["messages"][5])  # and a new one
    data, serialised = _written_with_what_it_serialised(parsed, monkeypatch)
    assert data == orjson.dumps(parsed.body)
    # Messages 0-4 repeat the last forwarded body and the new ones nobody edited are the bytes
    # they came as: only the edited message is serialised.
    assert [value for value in serialised if isinstance(value, dict)] == [
        parsed.body["messages"][5]
    ]
    written = parsed.written
    assert written is not None
    starts = [len(written.head), *(end + 1 for end in written.ends[:-1])]
    for start, end, message in zip(starts, written.ends, parsed.body["messages"], strict=True):
        assert data[start:end] == orjson.dumps(message)


def _responses(items: list[Any]) -> bytes:
    return orjson.dumps({"model": "m", "input": items, "store": False})


def _responses_turns(n: int, steps: int) -> list[dict[str, Any]]:
    """``n`` turns of a user message, reasoning and an answer; the last with ``steps`` tool
    calls and their outputs after its reasoning."""
    items: list[dict[str, Any]] = []
    for i in range(n):
        items.append({"type": "message", "role": "user", "content": f"question {i}"})
        items.append({"type": "reasoning", "summary": [], "encrypted_content": f"r{i}"})
        if i == n - 1:
            for step in range(steps):
                call = {"type": "function_call", "call_id": f"c{step}", "name": "read"}
                items.append({**call, "arguments": "{}"})
                items.append({"type": "function_call_output", "call_id": f"c{step}", "output": "x"})
        items.append({"type": "message", "role": "assistant", "content": f"answer {i}"})
    return items


def test_a_body_written_without_its_removed_items_indexes_only_what_it_brought_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reasoning items a long session's old turns lost (Responses) are not indexed again
    at every step: only the messages after the run taken from the last forwarded body are
    looked up among those received."""
    responses = FORMATS[Dialect.OPENAI_RESPONSES]
    key = ("ses_1", "openai-responses")
    bodies = BodyCache()
    received: list[dict[int, int]] = []
    original = bodies_module._received

    def recorded(parsed: Any, count: int) -> dict[int, int]:
        received.append(original(parsed, count))
        return received[-1]

    monkeypatch.setattr(bodies_module, "_received", recorded)
    for steps in (1, 2):
        raw = _responses(_responses_turns(20, steps))
        parsed = bodies.parse(key, responses, raw)
        live = len(parsed.messages) - 2 - 2 * steps  # the last turn's reasoning item
        # What the view does: a new list without the old turns' reasoning, the rest as it came.
        parsed.body["input"] = [
            item
            for index, item in enumerate(parsed.messages)
            if item["type"] != "reasoning" or index == live
        ]
        assert write(parsed, responses) == orjson.dumps(parsed.body)
        bodies.remember(key, raw, parsed)
    new = len(parsed.messages) - 3  # the second call, its output and the answer
    assert parsed.reused == new
    assert received[-1] == {id(parsed.messages[i]): i for i in range(new, new + 3)}


def test_a_body_whose_other_members_changed_is_still_written_exactly() -> None:
    bodies = BodyCache()
    first = chat(turn(2))
    parsed = bodies.parse(KEY, CHAT, first)
    write(parsed, CHAT)
    bodies.remember(KEY, first, parsed)
    second = orjson.dumps({"model": "m", "messages": turn(3), "tools": [{"x": 2}], "n": 1})
    parsed = bodies.parse(KEY, CHAT, second)
    assert parsed.reused > 0 and write(parsed, CHAT) == second


def test_a_body_it_cannot_write_is_left_to_the_caller() -> None:
    parsed = BodyCache().parse(KEY, CHAT, chat(turn(2)))
    parsed.body["messages"][1] = {"role": "user", "content": "x", "n": 2**70}
    assert write(parsed, CHAT) is None and parsed.written is None
    assert write(BodyCache().parse(None, CHAT, chat(turn(2))), CHAT) is None


# --- the rewrite, with and without the cache ----------------------------------------------


@pytest.fixture(scope="module")
def two_paths() -> Iterator[tuple[list[Addon], list[Addon], str]]:
    """The full request path (compression and memory) twice, on stores of their own."""
    with tempfile.TemporaryDirectory() as root:
        project = os.path.join(root, "project")
        os.makedirs(os.path.join(project, ".deep-memory"))
        with open(os.path.join(project, ".deep-memory", "MEMORY.md"), "w") as handle:
            handle.write(MEMORY_MD)
        paths = []
        for name in ("whole", "incremental"):
            settings = load_settings(
                {
                    "data_dir": os.path.join(root, name),
                    "allowed_roots": root,
                    "memory_semantic": "off",
                    "memory_captures": "false",
                },
                environ={},
            )
            stores = open_stores(settings, in_memory=True)
            paths.append(build_addons(settings, stores, memory_service(settings)))
        yield paths[0], paths[1], project


@PROPERTY
@given(
    session=sessions(),
    resent=st.lists(st.integers(0, 40), max_size=3),
    ahead=st.booleans(),
)
def test_incremental_and_whole_parses_forward_the_same_bytes(
    session: Session,
    resent: list[int],
    ahead: bool,
    two_paths: tuple[list[Addon], list[Addon], str],
) -> None:
    """Every request of a session, in every wire format, forwarded by the same addons (on
    stores of their own) once parsed whole and once through the body cache: the same bytes,
    and the cache's objects are still what the client sent. ``resent`` requests go twice (a
    retry) and a shorter one comes after them (a client that rewound). Without ``ahead``, the
    incremental path's deferred work never runs (each next request came first)."""
    whole, incremental, project = two_paths
    for rendered in renderings(session):
        headers = {
            "x-session-id": f"bodies-{rendered.dialect}-{os.urandom(6).hex()}",
            "X-Deep-Memory-Project": project,
        }
        bodies = BodyCache()
        key = (headers["x-session-id"], rendered.dialect.value)
        boundaries = list(rendered.boundaries)
        for index in resent:
            if boundaries:
                at = index % len(boundaries)
                boundaries.insert(at + 1, boundaries[at])
                boundaries.insert(at + 2, boundaries[at // 2])
        for boundary in boundaries:
            raw = orjson.dumps(rendered.request(boundary))
            expected = rewrite_request(raw, rendered.dialect, headers, whole)
            got = rewrite_request(raw, rendered.dialect, headers, incremental, bodies=bodies)
            assert got.outcome == expected.outcome, got.error
            assert got.body == expected.body
            for rewrite in (expected, got) if ahead else (expected,):
                for job in rewrite.flow.after if rewrite.flow is not None else ():
                    job()  # the deferred work, as once the answer is out
            kept = bodies._kept.get(key)
            if kept is not None:  # never edited by the addons
                list_key = FORMATS[rendered.dialect].messages_key
                sent = orjson.loads(raw)
                assert kept.messages == sent[list_key]
                assert kept.tail is None or kept.tail == {k: sent[k] for k in kept.tail}


@pytest.mark.parametrize(
    ("dialect", "message"),
    [
        (Dialect.OPENAI_CHAT, {"role": "user", "content": "hello"}),
        (Dialect.ANTHROPIC, {"role": "user", "content": [{"type": "text", "text": "hello"}]}),
        (
            Dialect.OPENAI_RESPONSES,
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        ),
    ],
)
def test_the_same_addition_to_a_shared_message_gives_the_same_copy(
    dialect: Dialect, message: dict[str, Any]
) -> None:
    """Two requests of a session share the client's message object: appending the same text
    to it gives each the same copy (the edit memo), the object itself stays as sent, and the
    message's items read the copy."""
    sent = orjson.loads(orjson.dumps(message))
    edits = EditMemo()
    copies = []
    for _ in range(2):
        body = {"model": "m", FORMATS[dialect].messages_key: [message]}
        conversation = parse_conversation(dialect, body)
        conversation.share_messages(edits)
        assert conversation.append_to_message(0, "remember this")
        copy = body[FORMATS[dialect].messages_key][0]
        assert orjson.dumps(copy).count(b"remember this") == 1
        assert all(_inside(item.holder, copy) for item in conversation.items)
        copies.append(copy)
    assert copies[0] is copies[1] and message == sent


def _inside(holder: Any, root: Any) -> bool:
    if holder is root:
        return True
    inner = root.values() if isinstance(root, dict) else root if isinstance(root, list) else ()
    return any(_inside(holder, value) for value in inner)


def test_a_step_with_memory_injected_serialises_only_its_new_messages(
    two_paths: tuple[list[Addon], list[Addon], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory appends to the system prompt on every request of the session: the same
    addition to the same message gives the copy it gave last time, so the session's next step
    writes its repeated messages from the bytes it forwarded (a copy per request made the
    writer serialise the whole body again from the system prompt on)."""
    _, incremental, project = two_paths
    headers = {"x-session-id": f"memory-{os.urandom(6).hex()}", "X-Deep-Memory-Project": project}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": f"You work in {project}."},
        {"role": "user", "content": "Why does the parser module keep its own cache of objects?"},
    ]
    bodies = BodyCache()
    forwarded = None
    serialised: list[Any] = []
    original = orjson.dumps

    def dumps(value: Any) -> bytes:
        serialised.append(value)
        return original(value)

    for step in range(3):
        messages = [
            *messages,
            {"role": "assistant", "content": f"Reading file {step}."},
            {"role": "user", "content": f"The parser cache holds {step} objects."},
        ]
        raw = chat(messages)
        serialised.clear()
        monkeypatch.setattr(bodies_module.orjson, "dumps", dumps)
        rewrite = rewrite_request(raw, Dialect.OPENAI_CHAT, headers, incremental, bodies=bodies)
        monkeypatch.undo()
        assert rewrite.changed, rewrite.error
        forwarded = orjson.loads(rewrite.body)["messages"]
        assert forwarded[0]["content"].startswith(f"You work in {project}.\n\n")
        assert "Never edit the generated parser tables" in forwarded[0]["content"]
    assert forwarded is not None
    # And the two new messages, which nothing was added to, go as they came: no message is
    # serialised at all.
    assert "The parser cache holds 2 objects." in rewrite.body.decode()
    assert [value for value in serialised if isinstance(value, dict)] == []


# --- light steps on the event loop ---------------------------------------------------------


async def test_light_steps_are_rewritten_on_the_event_loop_and_the_rest_on_workers(
    start_proxy, upstream, client
) -> None:
    import threading

    from proxy.pipeline import LIGHT_BODY_BYTES
    from tests.addons import Hook

    where: list[str] = []

    def spy(conversation, flow) -> bool:
        where.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        return False

    proxy = await start_proxy([Hook(spy)], upstream=[f"{upstream.url}/v1"])
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": "s"}]

    def step(output: str) -> list[dict[str, Any]]:
        call = f"call_{len(messages)}"
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {"name": "bash", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call, "content": output},
        ]

    plan = [
        [{"role": "user", "content": "first"}],  # nothing kept yet: a worker
        step("small"),  # a step of a few bytes: the loop
        step("x" * 40_000),  # more new bytes than a light step has: a worker
        step("small again"),  # the loop
        step("y" * 12_000),  # few bytes, but an output that may be compressed on arrival
        step("small once more"),  # the loop
        [{"role": "user", "content": "a new turn"}],  # a user turn (memory recall): a worker
        step("z" * 200),  # the loop
    ]

    timed: list[str] = []  # where each ran, as its answer's Server-Timing says

    async def send(session: str) -> bytes:
        body = orjson.dumps({"model": "m", "messages": messages, "tools": tools})
        async with client.post(
            proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
        ) as response:
            assert response.status == 200
            await response.read()
            timing = re.fullmatch(
                r'deepmem;dur=[0-9.]+;desc="proxy", rewrite;dur=([0-9.]+);desc="(\w+)"',
                response.headers["Server-Timing"],
            )
            assert timing is not None, response.headers["Server-Timing"]
            timed.append(timing[2])
        return body

    for added in plan:
        messages.extend(added)
        body = await send("ses_l")
    assert where == ["worker", "loop", "worker", "loop", "worker", "loop", "worker", "loop"]
    assert timed == where
    assert [r.body for r in upstream.requests][-1] == body  # the spy changed nothing
    where.clear()  # a long conversation: comparing and writing its bytes take too long
    messages[0]["content"] = "s" * LIGHT_BODY_BYTES
    for added in ([], step("small")):
        messages.extend(added)
        await send("ses_big")
    assert where == ["worker", "worker"]


async def test_anthropic_steps_with_moved_cache_marks_are_light(
    start_proxy, upstream, client
) -> None:
    """OpenCode moves Anthropic's cache marks to the last two messages at every step, so each
    step sends the previous step's last messages again, changed in their marks only. They are
    not new: such a step, the one right after a new user turn too, is rewritten on the event
    loop; the turn itself, and a step whose resent message is another text, on a worker."""
    import threading

    from tests.addons import Hook

    where: list[str] = []

    def spy(conversation, flow) -> bool:
        where.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        return False

    proxy = await start_proxy([Hook(spy)], upstream=[f"anthropic={upstream.url}/v1"])
    messages: list[dict[str, Any]] = []
    mark = {"type": "ephemeral"}

    def step() -> list[dict[str, Any]]:
        call = f"toolu_{len(messages)}"
        return [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": call, "name": "bash", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": "ok"}],
            },
        ]

    def user(text: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "text", "text": text}]}]

    async def send() -> None:
        wire = [dict(m, content=[dict(b) for b in m["content"]]) for m in messages]
        for message in wire[-2:]:
            message["content"][-1]["cache_control"] = mark
        body = orjson.dumps({"model": "m", "max_tokens": 10, "system": "s", "messages": wire})
        async with client.post(
            proxy.url + "/anthropic/messages",
            data=body,
            headers={"x-session-id": "ses_marks", "anthropic-version": "2023-06-01"},
        ) as response:
            assert response.status == 200
            await response.read()

    plan = [
        user("first"),  # nothing kept yet: a worker
        [{"role": "assistant", "content": [{"type": "text", "text": "on it"}]}, *step()[1:]],
        step(),  # the loop
        step(),  # the loop
        user("a new turn"),  # a user turn (memory recall): a worker
        step(),  # right after it, the turn's message resent with its mark moved: the loop
        step(),  # the loop
    ]
    for added in plan:
        messages.extend(added)
        await send()
    assert where == ["worker", "worker", "loop", "loop", "worker", "loop", "loop"]
    # The resent tool result is another output now, one large enough to be compressed on
    # arrival: that is new, whatever its marks.
    result = messages[-1]["content"][0]
    messages[-1] = {"role": "user", "content": [{**result, "content": "y" * 12_000}]}
    messages.extend(step())
    await send()
    assert where[-1] == "worker"


@pytest.mark.parametrize("session", ["ses_d", "s" * 250])
async def test_a_step_waits_for_its_session_s_deferred_work_or_goes_to_a_worker(
    start_proxy, upstream, client, session: str
) -> None:
    """What a request defers (compressions made ahead, their originals) may not be done when
    the session's next step comes. Work a worker has begun makes what that step needs: the
    step waits for it (the loop free meanwhile), then is light. Work still queued (every
    worker busy) is cancelled, and the step, which makes it itself, is rewritten on a worker,
    not on the event loop every session's relay runs on. The deferred work is found under
    the name the rewrite gives the session, an id over ``MAX_SESSION_ID_LENGTH`` cut to it
    as well. Work begun that runs on past ``DEFERRED_WAIT_SECONDS`` (stuck) is not waited
    for longer: the step goes to a worker."""
    import asyncio
    import threading

    from proxy import pipeline as rewrites
    from proxy.app import STATE
    from proxy.pipeline import REWRITE_WORKERS
    from proxy.sessions import MAX_SESSION_ID_LENGTH

    where: list[str] = []
    release = threading.Event()
    began = threading.Event()
    begun: list[int] = []  # the steps whose slow work began
    slow_steps = {2, 4, 5}  # these requests leave work that takes a while

    def spy(conversation, flow) -> bool:
        where.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        if len(where) in slow_steps:
            step = len(where)

            def slow_work_ahead() -> None:
                begun.append(step)
                began.set()
                release.wait(10)

            flow.defer(slow_work_ahead)
        return False

    proxy = await start_proxy([Hook(spy)], upstream=[f"{upstream.url}/v1"])
    runner = proxy.app[STATE].rewrites
    key = session[:MAX_SESSION_ID_LENGTH]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
    ]

    async def send_step() -> None:
        call = f"call_{len(messages)}"
        messages.extend(
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "b", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call, "content": "small"},
            ]
        )
        body = orjson.dumps({"model": "m", "messages": messages})
        async with client.post(
            proxy.url + "/v1/chat/completions", data=body, headers={"x-session-id": session}
        ) as response:
            assert response.status == 200
            await response.read()

    async def deferred_work_done() -> None:
        for _ in range(500):  # the deferred work is done once the loop has heard of it
            if not runner.deferring(key):
                return
            await asyncio.sleep(0.01)

    await send_step()  # nothing kept yet: a worker
    await deferred_work_done()  # what every request defers (its walk's items made ahead)
    await send_step()  # light: the loop; defers the slow work
    assert await asyncio.to_thread(began.wait, 10)
    bound = rewrites.DEFERRED_WAIT_SECONDS
    rewrites.DEFERRED_WAIT_SECONDS = 30.0  # longer than this test waits
    try:
        waiting = asyncio.create_task(send_step())  # waits for the work begun, then the loop
        await asyncio.sleep(0.3)
    finally:
        rewrites.DEFERRED_WAIT_SECONDS = bound
    assert not waiting.done() and len(where) == 2
    release.set()
    await waiting
    assert where == ["worker", "loop", "loop"]

    # Every worker busy (another session's work): the slow work of the next step is queued.
    release.clear()
    blockers = threading.Event()
    for _ in range(REWRITE_WORKERS):
        runner.run_after("another", [lambda: blockers.wait(10)])
    began.clear()
    await send_step()  # the loop again; defers the slow work, which cannot begin
    assert runner.deferring(key) and not began.is_set()
    stepped = asyncio.create_task(send_step())  # a worker, once one is free
    await asyncio.sleep(0.3)
    blockers.set()
    await stepped
    assert where == ["worker", "loop", "loop", "loop", "worker"]

    # Work begun that does not finish (stuck): the step waits no longer than the bound.
    for _ in range(500):
        if begun[-1] == 5:  # the fifth step's slow work, begun (and held)
            break
        await asyncio.sleep(0.01)
    assert begun == [2, 5]  # the fourth's was cancelled: its step did what it was for
    started = asyncio.get_running_loop().time()
    await send_step()
    assert asyncio.get_running_loop().time() - started < bound + 5
    assert where == ["worker", "loop", "loop", "loop", "worker", "worker"]
    assert not release.is_set()  # answered while the work still ran
    release.set()


def test_the_step_that_sends_its_turn_s_first_message_again_with_moved_marks_is_light() -> None:
    """With Anthropic's moving cache marks, the step after a new user turn sends the turn's
    first message again, changed in its marks only. That step was compressed whole once more
    and kept off the event loop; it is resumed now (0f73b28), and light like the steps around
    it. The first message of a session, sent again, repeats nothing: not light."""
    from proxy.pipeline import rewrite_light_step

    headers, bodies = {"x-session-id": "ses_marks"}, BodyCache()
    addons = [Hook(lambda conversation, flow: False)]
    messages: list[dict[str, Any]] = []

    def send(*added: dict[str, Any]) -> bool:
        """Whether the request with ``added`` is a light step (then rewritten as a whole)."""
        messages.extend(added)
        body = with_cache_marks({"model": "m", "max_tokens": 9, "messages": messages}, "messages")
        raw = orjson.dumps(body)
        args = (raw, Dialect.ANTHROPIC, headers, addons, None, None, bodies)
        found = rewrite_light_step(*args)
        light = isinstance(found, Rewrite)
        if not light:
            rewrite_request(*args, read=found)
        return light

    def step(n: int) -> list[dict[str, Any]]:
        use = {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": "ls"}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "a.py"}
        return [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]

    def said(role: str, text: str) -> dict[str, Any]:
        return {"role": role, "content": [{"type": "text", "text": text}]}

    assert not send(said("user", "task"))  # nothing kept yet
    assert not send(*step(1))  # the only message kept comes again changed: nothing repeated
    assert send(*step(2))
    assert not send(said("assistant", "done"), said("user", "next task"))  # a new turn
    assert send(*step(3))  # its first message comes again, its mark moved
    assert send(*step(4))
    assert send(*step(5))


def _anthropic_session(bodies: BodyCache) -> tuple[list[dict[str, Any]], Any]:
    """A session of a task and two tool steps, remembered in ``bodies``, and a function
    giving the raw body of its messages plus some (cache marks on the last two, as OpenCode
    sends them)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "a"}]}]

    def raw(*added: dict[str, Any]) -> bytes:
        body = {"model": "m", "max_tokens": 9, "messages": [*messages, *added]}
        return orjson.dumps(with_cache_marks(body, "messages"))

    for n in range(2):
        use = {"type": "tool_use", "id": f"t{n}", "name": "bash", "input": {"command": "ls"}}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "content": "a.py"}
        messages += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
        rewrite_request(raw(), Dialect.ANTHROPIC, {"x-session-id": "ses_r"}, [], bodies=bodies)
    return messages, raw


def test_a_step_found_not_light_is_rewritten_from_what_its_light_attempt_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Anthropic user turn cannot be told from a tool step by its bytes: it is parsed and
    walked on the event loop, found not light, and goes to a worker, which goes on from what
    was read (it parsed and walked the body a second time before)."""
    from proxy import pipeline
    from proxy.pipeline import rewrite_light_step

    bodies = BodyCache()
    _, raw = _anthropic_session(bodies)
    parses: list[int] = []
    walks: list[int] = []
    parse, walk = BodyCache.parse, pipeline.parse_conversation
    monkeypatch.setattr(BodyCache, "parse", lambda *a: parses.append(1) or parse(*a))
    monkeypatch.setattr(
        pipeline, "parse_conversation", lambda *a, **k: walks.append(1) or walk(*a, **k)
    )
    seen: list[int] = []
    addons = [Hook(lambda conversation, flow: seen.append(len(conversation.items)) and False)]
    turn = raw(
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
        {"role": "user", "content": [{"type": "text", "text": "next task"}]},
    )
    args = (turn, Dialect.ANTHROPIC, {"x-session-id": "ses_r"}, addons, None, None, bodies)
    found = rewrite_light_step(*args)
    assert isinstance(found, Read) and not seen  # no addon ran on the loop
    rewrite = rewrite_request(*args, read=found)
    assert rewrite.outcome == "forwarded" and rewrite.body is turn
    assert rewrite.conversation is found.conversation and len(seen) == 1
    assert parses == [1] and walks == [1]
    assert bodies._kept[("ses_r", "anthropic")].raw is turn  # kept for the next step


def test_what_a_light_attempt_read_is_read_again_after_another_request_of_its_session() -> None:
    """Between the event loop's attempt and the worker, another request of the session may
    have been rewritten (its kept body, edits and walk moved on): the worker parses again."""
    from proxy.pipeline import rewrite_light_step

    bodies = BodyCache()
    _, raw = _anthropic_session(bodies)
    turn = raw({"role": "user", "content": [{"type": "text", "text": "next task"}]})
    args = (turn, Dialect.ANTHROPIC, {"x-session-id": "ses_r"}, [Hook(lambda c, f: False)])
    found = rewrite_light_step(*args, None, None, bodies)
    assert isinstance(found, Read)
    rewrite_request(raw(), *args[1:], bodies=bodies)  # meanwhile: the session's last body again
    again = rewrite_request(*args, bodies=bodies, read=found)
    assert again.conversation is not found.conversation
    assert again.conversation is not None and again.outcome == "forwarded"
    assert len(again.conversation.items) == len(found.conversation.items)


def _remembered(dialect: Dialect, body: dict[str, Any]) -> tuple[BodyCache, tuple[str, str]]:
    bodies, key = BodyCache(), ("ses_hint", dialect.value)
    raw = orjson.dumps(body)
    bodies.remember(key, raw, bodies.parse(key, FORMATS[dialect], raw))
    return bodies, key


@pytest.mark.parametrize(
    ("dialect", "items", "tool_step", "user_step"),
    [
        (
            Dialect.OPENAI_CHAT,
            "messages",
            [
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "bash"}}]},
                {"role": "tool", "tool_call_id": "c", "content": 'says "role":"user"'},
            ],
            [{"role": "user", "content": "next"}],
        ),
        (
            Dialect.OPENAI_RESPONSES,
            "input",
            [
                {"type": "function_call", "call_id": "c", "name": "bash", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c", "output": "done"},
            ],
            [{"role": "user", "content": [{"type": "input_text", "text": "next"}]}],
        ),
    ],
)
def test_the_light_step_hint_sends_a_new_user_message_to_a_worker_unparsed(
    dialect: Dialect,
    items: str,
    tool_step: list[dict[str, Any]],
    user_step: list[dict[str, Any]],
) -> None:
    from proxy.pipeline import LIGHT_STEP_BYTES, may_be_light_step

    first = [{"role": "user", "content": "task"}]
    bodies, key = _remembered(dialect, {"model": "m", items: first, "tools": [{"x": 1}]})

    def hint(added: list[dict[str, Any]]) -> bool:
        raw = orjson.dumps({"model": "m", items: first + added, "tools": [{"x": 1}]})
        return may_be_light_step(bodies, key, dialect, raw)

    assert hint(tool_step)  # a quoted "role":"user" inside a string is not a message
    assert not hint(user_step)
    assert not hint([*tool_step, *user_step])
    assert not hint([{**tool_step[-1], "extra": "x" * LIGHT_STEP_BYTES}])  # too many bytes


def test_the_light_step_hint_leaves_an_anthropic_user_turn_to_the_parse() -> None:
    from proxy.pipeline import LIGHT_BODY_BYTES, may_be_light_step

    first = [{"role": "user", "content": [{"type": "text", "text": "task"}]}]
    bodies, key = _remembered(Dialect.ANTHROPIC, {"model": "m", "messages": first})
    result = [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]
    turn = [{"type": "text", "text": "next"}]
    for content in (result, turn):
        raw = orjson.dumps(
            {"model": "m", "messages": [*first, {"role": "user", "content": content}]}
        )
        assert may_be_light_step(bodies, key, Dialect.ANTHROPIC, raw)
    # Messages past the light body size are not light, whatever follows them.
    big = [{"role": "user", "content": [{"type": "text", "text": "x" * LIGHT_BODY_BYTES}]}]
    bodies, key = _remembered(Dialect.ANTHROPIC, {"model": "m", "messages": big})
    raw = orjson.dumps({"model": "m", "messages": [*big, {"role": "user", "content": result}]})
    assert not may_be_light_step(bodies, key, Dialect.ANTHROPIC, raw)


def test_an_opted_out_request_is_kept_so_the_next_is_parsed_from_where_it_differs() -> None:
    from proxy.opt_out import OPT_OUT_HEADER, OptOut

    bodies, opt_out = BodyCache(), OptOut()
    headers = {"x-session-id": "ses_1", OPT_OUT_HEADER: "off"}
    messages = turn(3)
    for _ in range(2):
        raw = chat(messages)
        rewrite = rewrite_request(
            raw, Dialect.OPENAI_CHAT, headers, [], opt_out=opt_out, bodies=bodies
        )
        assert rewrite.body is raw and rewrite.relay_reason is not None
        messages = [*messages, {"role": "user", "content": "more"}]
    assert bodies.hits == 1


def test_a_session_s_next_body_is_walked_from_where_it_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rewrite hands the cache's kept walk to the next body of the session: only the new
    messages are read into the view."""
    from compressors.wire import openai_chat

    read: list[int] = []
    real = openai_chat.message_object

    def counted(index: int, message: object) -> Any:
        read.append(index)
        return real(index, message)

    monkeypatch.setattr(openai_chat, "message_object", counted)

    class Reads:
        def request(self, conversation: Any, flow: Any) -> bool:
            return False

    bodies, headers, addons = BodyCache(), {"x-session-id": KEY[0]}, [Reads()]
    rewrite_request(chat(turn(2)), Dialect.OPENAI_CHAT, headers, addons, bodies=bodies)
    assert read == [0, 1, 2, 3, 4]
    read.clear()
    rewrite_request(chat(turn(3)), Dialect.OPENAI_CHAT, headers, addons, bodies=bodies)
    assert read == [5, 6]
    read.clear()  # a request without a session: nothing is kept for it, nothing taken
    rewrite_request(chat(turn(3)), Dialect.OPENAI_CHAT, {}, addons, bodies=bodies)
    assert read == [0, 1, 2, 3, 4, 5, 6]


def test_the_items_of_a_session_s_next_walk_are_made_once_its_answer_is_out() -> None:
    """Making the view's items of the repeated messages is deferred work of the request
    before (``Walked.make_items``), first of its jobs: the next body's walk takes them."""

    class Reads:
        def request(self, conversation: Any, flow: Any) -> bool:
            return False

    bodies, headers, addons = BodyCache(), {"x-session-id": KEY[0]}, [Reads()]
    first = rewrite_request(chat(turn(2)), Dialect.OPENAI_CHAT, headers, addons, bodies=bodies)
    assert first.flow is not None and first.conversation is not None
    walked = first.conversation.walked
    assert walked is not None and walked.made == []
    assert first.flow.after[1:] == [walked.make_items]  # after the body's ``read_ahead``
    for job in first.flow.after:
        job()
    made = walked.made[0]
    second = rewrite_request(chat(turn(3)), Dialect.OPENAI_CHAT, headers, addons, bodies=bodies)
    assert second.conversation is not None
    assert second.conversation.items[: len(made)] == made
    assert all(a is b for a, b in zip(second.conversation.items, made, strict=False))
    assert walked.made == []


def test_a_step_s_bytes_are_compared_with_the_previous_body_once(monkeypatch) -> None:
    """The growth hint (before the parse, on the event loop) and the parse both need how many
    messages the body repeats; the bytes are compared once (~16 µs for 500 KB), and again
    only for another body or another previous one."""
    calls: list[int] = []
    count = bodies_module._repeated

    def counted(kept: Any, raw: bytes) -> int:
        calls.append(len(raw))
        return count(kept, raw)

    monkeypatch.setattr(bodies_module, "_repeated", counted)
    bodies = BodyCache()
    first = chat(turn(2))
    bodies.remember(KEY, first, bodies.parse(KEY, CHAT, first))
    second = chat(turn(3))
    assert bodies.growth(KEY, second) is not None
    parsed = bodies.parse(KEY, CHAT, second)
    assert parsed.reused == 5 and parsed.body == orjson.loads(second)
    assert calls == [len(second)]
    bodies.remember(KEY, second, parsed)
    third = chat(turn(4))
    assert bodies.parse(KEY, CHAT, third).reused == 7  # another previous body: compared anew
    assert calls == [len(second), len(third)]


def test_an_unexpected_error_while_parsing_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """``rewrite_request`` never raises: a bug in the body cache's parse forwards the client's
    bytes (it escaped the hook before the parse moved inside its guard)."""

    def broken(*_: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(BodyCache, "parse", broken)
    raw = chat(turn(2))
    rewrite = rewrite_request(
        raw,
        Dialect.OPENAI_CHAT,
        {"x-session-id": "s"},
        [Hook(lambda c, f: True)],
        bodies=BodyCache(),
    )
    assert rewrite.outcome == "failed_open" and rewrite.body is raw
    assert rewrite.error == "RuntimeError: a bug"
