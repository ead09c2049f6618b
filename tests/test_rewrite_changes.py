"""The changes ``compress`` reports (``CompressionResult.changes``, behind the dashboard's
request view) describe its rewrite exactly: every changed or dropped item once, at its index
in the body as the client sent it, with the text that was forwarded and the original's key.

Sessions from ``tests.strategies``, in all three wire formats, replayed as in
``tests/test_properties.py``: the request as sent is compared with what ``compress`` made of
it, item by item (``align``)."""

from __future__ import annotations

import copy
import json

from hypothesis import given
from hypothesis import strategies as st

from compressors.changes import Change, ChangeKind
from compressors.pipeline import CompressionSettings, SessionMemo, compress
from compressors.view import Dialect, Kind, Role
from compressors.wire import parse_conversation
from tests.strategies import Session, renderings, sessions, settings_strategy
from tests.test_pipeline import run
from tests.test_pipeline import session as pipeline_session
from tests.test_properties import PROPERTY, Sent, colds, describe, replay

TOOL_OUTPUT_KINDS = (ChangeKind.COMPRESSED, ChangeKind.DEDUPED)


def _take(
    left: list[Change], kinds: tuple[ChangeKind, ...], message: int, text: str, what: str
) -> Change:
    """The change of one of ``kinds`` at ``message`` that forwarded ``text`` (one message may
    carry several results: an Anthropic user message's tool_result blocks)."""
    found = [c for c in left if c.kind in kinds and c.message == message and c.text == text]
    assert found, f"{what}: no change of {kinds} at message {message} forwarding its text"
    left.remove(found[0])
    return found[0]


def check_changes(sent: Sent) -> None:
    left = list(sent.result.changes)
    originals = sent.result.originals
    for change in left:
        if change.key is not None:
            assert len(originals[change.key]) == change.chars_before, change
        if change.chars_after:
            assert change.chars_after == len(change.text), change
    for old, new in sent.changed_pairs:
        what = describe(old)
        if old.kind is Kind.TOOL_RESULT:
            change = _take(left, TOOL_OUTPUT_KINDS, old.message, new.text, what)
            assert change.text == new.text and change.tool == (old.tool_name or None), what
            assert change.key is not None and originals[change.key] == old.text, what
            assert change.chars_before == len(old.text), what
        elif old.kind is Kind.TOOL_CALL:
            cuts = [c for c in left if c.kind is ChangeKind.CALL_CUT and c.message == old.message]
            change = next(c for c in cuts if json.loads(c.text) == json.loads(new.text))
            left.remove(change)
            assert change.key is not None and json.loads(originals[change.key]) == json.loads(
                old.text
            ), what
        elif old.role is Role.USER:
            reminders = [
                c
                for c in left
                if c.kind is ChangeKind.REMINDER_DROPPED and c.message == old.message
            ]
            assert reminders, f"{what} changed, no reminder reported"
            for change in reminders:
                assert change.text in new.text and originals[change.key or ""] in old.text
                left.remove(change)
        else:  # <think> blocks out of an older turn's assistant text
            change = _take(left, (ChangeKind.REASONING_DROPPED,), old.message, new.text, what)
            assert change.text == new.text and change.chars_before == len(old.text), what
    for item in sent.alignment.dropped:
        change = _take(left, (ChangeKind.REASONING_DROPPED,), item.message, "", describe(item))
        assert change.chars_after == 0
    assert left == [], f"changes reported for nothing that changed: {left}"


@PROPERTY
@given(sessions(), settings_strategy, colds)
def test_the_changes_describe_the_rewrite_exactly(
    session: Session, options: CompressionSettings, cold_flags: list[bool]
) -> None:
    for rendered in renderings(session):
        for sent, _ in replay(rendered, options, cold_flags):
            check_changes(sent)


def test_a_change_is_new_once_then_re_applied():
    memo = SessionMemo()
    news = []
    for _ in range(2):
        _, result = run(pipeline_session(3), memo)
        assert [(c.kind, c.message, c.tool) for c in result.changes] == [
            (ChangeKind.COMPRESSED, 3, "bash"),
            (ChangeKind.COMPRESSED, 5, "bash"),
        ]
        news.append([c.new for c in result.changes])
    assert news == [[True, True], [False, False]]


@given(st.lists(st.booleans(), min_size=1, max_size=12), st.lists(st.booleans(), max_size=12))
def test_responses_indices_map_back_to_the_body_as_sent(first: list[bool], second: list[bool]):
    """Reasoning items dropped in two rounds: every item left maps back to its own index."""
    entries = [
        {"type": "reasoning", "summary": [], "id": f"r{n}"}
        if reasoning
        else {"role": "user", "content": f"u{n}", "id": f"u{n}"}
        for n, reasoning in enumerate(first)
    ]
    sent = copy.deepcopy(entries)
    conversation = parse_conversation(Dialect.OPENAI_RESPONSES, {"input": entries})
    reasoning = [item for item in conversation.items if item.kind is Kind.REASONING]
    half = [item for n, item in enumerate(reasoning) if n < len(second) and second[n]]
    for doomed in (half, [item for item in reasoning if item not in half]):
        conversation.wire.drop_reasoning(conversation, doomed)
        for index, entry in enumerate(conversation.body["input"]):
            assert sent[conversation.arrived_index(index)] is not None
            assert sent[conversation.arrived_index(index)]["id"] == entry["id"]


def test_a_cut_call_is_named_by_its_index_as_sent_after_reasoning_items_went():
    content = "\n".join(f"def handler_{n}(request):\n    return respond({n})" for n in range(60))
    arguments = json.dumps({"file_path": "/repo/handlers.py", "content": content})
    sent = [
        {"role": "user", "content": "write the handlers file"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "I will write it"}]},
        {"type": "function_call", "call_id": "w", "name": "Write", "arguments": arguments},
        {"type": "function_call_output", "call_id": "w", "output": "Wrote /repo/handlers.py"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "ok"}],
        },
        {"role": "user", "content": "thanks, now the tests"},
    ]
    conversation = parse_conversation(Dialect.OPENAI_RESPONSES, {"input": copy.deepcopy(sent)})
    result = compress(conversation, SessionMemo(), CompressionSettings(arrival_kinds=frozenset()))
    dropped, cut = result.changes
    assert (dropped.kind, dropped.message, dropped.chars_before) == (
        ChangeKind.REASONING_DROPPED,
        1,
        len("I will write it"),
    )
    assert (cut.kind, cut.message, cut.tool) == (ChangeKind.CALL_CUT, 2, "Write")
    assert conversation.body["input"][1]["arguments"] == cut.text  # now at index 1
    assert result.originals[cut.key or ""] == arguments
