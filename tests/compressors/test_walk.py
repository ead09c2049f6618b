"""A walk that goes on from the session's previous one (``Conversation.begin_walk``) finds
exactly the items a walk of the whole body finds."""

from __future__ import annotations

import copy
import json
import operator
from operator import attrgetter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compressors.view import MAX_RESENT, Conversation, Dialect, Walked
from compressors.wire import parse_conversation
from tests.compressors.test_view_append import CAPTURE_FILES
from tests.conftest import CAPTURES
from tests.strategies import render, sessions

_fields = attrgetter("kind", "role", "message", "holder", "key", "call_id", "tool_name")
LIST_KEY = {
    Dialect.OPENAI_CHAT: "messages",
    Dialect.ANTHROPIC: "messages",
    Dialect.OPENAI_RESPONSES: "input",
}


def _items(conversation: Conversation) -> list[tuple[Any, ...]]:
    return [_fields(item) for item in conversation.items]


def _same_walk(dialect: Dialect, body: dict[str, Any], count: int, resent: int = 0) -> Walked:
    """Walk the body's first ``count`` messages, then the whole body (the same message
    objects but the ``resent`` last of those, which are equal copies, in a new body) going on
    from there: it must find what a whole walk finds."""
    key = LIST_KEY[dialect]
    messages = body[key]
    earlier = parse_conversation(dialect, {**body, key: messages[:count]}, keep=True)
    assert earlier.walked is not None
    again = count - resent
    copies = copy.deepcopy(messages[again:count])
    later = {**body, key: [*messages[:again], *copies, *messages[count:]]}
    resumed = parse_conversation(dialect, later, earlier.walked, keep=True)
    whole = parse_conversation(dialect, {**body, key: list(messages)}, keep=True)
    assert _items(resumed) == [
        (*fields[:3], later if fields[3] is whole.body else fields[3], *fields[4:])
        for fields in _items(whole)
    ]
    assert resumed.last_user_message == whole.last_user_message
    assert resumed.walked is not None and whole.walked is not None
    assert resumed.walked.fields == whole.walked.fields
    assert resumed.walked.call_names == whole.walked.call_names
    assert resumed.walked.last_user_message == whole.walked.last_user_message
    return earlier.walked


@pytest.mark.parametrize("dialect", list(CAPTURE_FILES))
def test_a_walk_from_any_earlier_message_finds_the_whole_walk(dialect: Dialect) -> None:
    body = json.loads((CAPTURES / CAPTURE_FILES[dialect]).read_text())["body"]
    for count in range(len(body[LIST_KEY[dialect]]) + 1):
        _same_walk(dialect, body, count)


@settings(max_examples=40, deadline=None)
@given(sessions(), st.sampled_from(list(Dialect)), st.data())
def test_a_walk_from_an_earlier_request_finds_the_whole_walk(session, dialect, data) -> None:
    rendered = render(session, dialect)
    boundary = data.draw(st.sampled_from(rendered.boundaries))
    count = data.draw(st.integers(0, boundary.end))
    resent = data.draw(st.integers(0, min(count, MAX_RESENT + 1)))
    body = rendered.request(boundary)
    _same_walk(dialect, body, count, resent)


@pytest.mark.parametrize("dialect", list(CAPTURE_FILES))
def test_a_body_that_sends_its_last_messages_again_changed_is_walked_from_before_them(
    dialect: Dialect,
) -> None:
    """OpenCode moves Anthropic's cache marks to the last two messages on every request: the
    messages before them are taken from the previous walk (its items made ahead are used),
    and those from the first one sent again are read again."""
    body = json.loads((CAPTURES / CAPTURE_FILES[dialect]).read_text())["body"]
    key = LIST_KEY[dialect]
    messages = body[key]
    count = len(messages) - 1
    for resent in range(1, MAX_RESENT + 2):
        earlier = parse_conversation(dialect, {**body, key: messages[:count]}, keep=True)
        walked = earlier.walked
        assert walked is not None
        walked.make_items()
        made = walked.made[0]
        again = count - resent
        later = [*messages[:again], *copy.deepcopy(messages[again:count]), *messages[count:]]
        resumed = parse_conversation(dialect, {**body, key: later}, walked, keep=True)
        assert resumed.walked is not None
        head = len(resumed.items) - len(resumed.walked.fields)  # the system prompt's items
        taken = [i for i, item in enumerate(made) if item.message < again]
        if resent <= MAX_RESENT and again > 0:
            assert all(map(operator.is_, resumed.items[head : head + len(taken)], made))
            assert not {id(item) for item in resumed.items[head + len(taken) :]} & set(
                map(id, made)
            )
        else:  # further back than the walk noted: walked whole
            assert not {id(item) for item in resumed.items} & set(map(id, made))
        _same_walk(dialect, body, count, resent)


@pytest.mark.parametrize("dialect", list(CAPTURE_FILES))
def test_messages_that_are_not_the_same_objects_are_walked_again(dialect: Dialect) -> None:
    body = json.loads((CAPTURES / CAPTURE_FILES[dialect]).read_text())["body"]
    key = LIST_KEY[dialect]
    messages = body[key]
    earlier = parse_conversation(dialect, {**body, key: messages[:-1]}, keep=True)
    assert earlier.walked is not None
    # An equal copy of one repeated message (a client that rewrote it): nothing is taken.
    rewritten = [*messages[:1], copy.deepcopy(messages[1]), *messages[2:]]
    later = parse_conversation(dialect, {**body, key: rewritten}, earlier.walked)
    holders = [item.holder for item in later.items if item.message == 1]
    assert holders and all(
        holder is rewritten[1] or _inside(holder, rewritten[1]) for holder in holders
    )
    # A body shorter than the one walked before is walked whole as well.
    shorter = parse_conversation(dialect, {**body, key: messages[:2]}, earlier.walked)
    alone = parse_conversation(dialect, {**body, key: messages[:2]})
    assert [fields[2:] for fields in _items(shorter)] == [fields[2:] for fields in _items(alone)]


def _walked_but_the_last() -> tuple[dict[str, Any], list[Any], Conversation]:
    """A chat capture's body, its messages, and a kept walk of all of them but the last."""
    body = json.loads((CAPTURES / CAPTURE_FILES[Dialect.OPENAI_CHAT]).read_text())["body"]
    messages = body["messages"]
    earlier = parse_conversation(
        Dialect.OPENAI_CHAT, {**body, "messages": messages[:-1]}, keep=True
    )
    return body, messages, earlier


def test_the_items_taken_are_new_objects() -> None:
    """Stages change items in place (a compressed output points at a copied holder): the
    items a walk takes from the previous one must not be the previous request's."""
    body, messages, earlier = _walked_but_the_last()
    walked = earlier.walked
    assert walked is not None
    first = parse_conversation(Dialect.OPENAI_CHAT, {**body, "messages": list(messages)}, walked)
    before = _items(first)
    for item in first.items:
        item.holder, item.message = {}, -5
    again = parse_conversation(Dialect.OPENAI_CHAT, {**body, "messages": list(messages)}, walked)
    assert _items(again) == before
    assert not {id(item) for item in again.items} & {id(item) for item in earlier.items}


def test_items_made_ahead_are_taken_by_one_walk_and_later_walks_make_their_own() -> None:
    """``make_items`` (deferred work of the request that left the walk) gives the next walk
    its items; a second walk from the same place (a retry) must not get the first one's, which
    its stages have changed."""
    body, messages, earlier = _walked_but_the_last()
    walked = earlier.walked
    assert walked is not None
    walked.make_items()
    walked.make_items()  # once is enough: nothing more is made
    assert len(walked.made) == 1
    made = walked.made[0]
    assert [_fields(item) for item in made] == walked.fields
    first = parse_conversation(Dialect.OPENAI_CHAT, {**body, "messages": list(messages)}, walked)
    assert first.items[: len(made)] == made
    assert all(map(operator.is_, first.items, made))
    assert walked.made == []
    before = _items(first)
    for item in first.items:
        item.holder, item.message = {}, -5
    again = parse_conversation(Dialect.OPENAI_CHAT, {**body, "messages": list(messages)}, walked)
    assert _items(again) == before
    assert not {id(item) for item in again.items} & {id(item) for item in first.items}


def _inside(holder: Any, message: Any) -> bool:
    if holder is message:
        return True
    inner = message.values() if isinstance(message, dict) else message
    return isinstance(message, dict | list) and any(_inside(holder, value) for value in inner)


def test_a_walk_nobody_keeps_records_nothing() -> None:
    body = json.loads((CAPTURES / CAPTURE_FILES[Dialect.OPENAI_CHAT]).read_text())["body"]
    assert parse_conversation(Dialect.OPENAI_CHAT, body).walked is None
